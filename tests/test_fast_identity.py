"""The analysis build mode (value-free weights) gives the materialised build's analysis, op for op: every op's
type, name, layer, inputs (shapes, dtypes, producers, stored bytes), outputs, const bytes, tile kind and zero
flag, hence identical op counts, tiles and bytes by category, layer and op. On the structure config at 4 layers
through the build child (an A/B in one process), on 2-layer full-width configs of three families, and compressed
with every preset on the structure config at 14 layers; prefill and decode+prefill (one analysis per function)
on the tiny config."""

import os
from dataclasses import replace

import pytest
import torch

from analyzer.analysis.accounting import account
from analyzer.analysis.compression import compression_report
from analyzer.analysis.record import function_analysis_files, read_analysis_file
from analyzer.convert.compress import needs_untie, parse_spec
from analyzer.convert.header_blobs import compress_program, to_program, walk_program
from analyzer.convert.launch import PACKAGE_NAME, run_builds
from analyzer.convert.step import convert_step, trace_step
from analyzer.ir.coreml.mil_reader import read_program
from analyzer.model.decode import DecodeStep, build_model, untie_embeddings_
from analyzer.model.sources import DEFAULT_PRESET, STRUCTURE_OVERRIDES, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, BuildSpec
from analyzer.model.valuefree import (
    ZeroPageProducts,
    assign_value_free_weights_,
    build_value_free_model,
    zero_pages,
)

from .conftest import TINY_CTX, TINY_OVERRIDES, TINY_Q_LEN, representatives

pytestmark = pytest.mark.conversion


def canonical(program, names: bool = True) -> list[tuple]:
    """A program's op records with each op's inputs in parameter order (protobuf maps keep no order)."""
    out = []
    for op in program.ops:
        inputs = tuple((r.param, r.tensor if names else r.tensor.shape, r.producer, r.is_const, r.stored_bytes)
                       for r in sorted(op.inputs, key=lambda r: r.param))
        outputs = op.outputs if names else tuple((t.shape, t.dtype, t.nbytes) for t in op.outputs)
        out.append((op.type, op.name if names else "", op.layer, op.layer_from, inputs, outputs, op.const_bytes,
                    op.tile_kind, op.const_zero))
    return out


def assert_same_analysis(analysis, materialised, names: bool = True) -> None:
    assert canonical(analysis, names) == canonical(materialised, names)
    a, m = account(analysis), account(materialised)
    assert a.to_json() == m.to_json()  # bytes per token by category, by layer
    strip = (lambda r: {k: v for k, v in r.items() if k != "name"}) if not names else (lambda r: r)
    assert [strip(r) for r in a.op_rows()] == [strip(r) for r in m.op_rows()]


# ------------------------------------------------------------------------------------------------- in process
def _materialised(source, variant: str, ctx: int, path, plans=()):
    model = build_model(source, torch.float16)
    untied = bool(plans) and needs_untie(plans[0]) and untie_embeddings_(model)
    mlmodel = convert_step(DecodeStep(model, ctx, variant, "state").eval(), keep_duplicate_consts=untied)
    if not plans:
        mlmodel.save(str(path / PACKAGE_NAME))
        return [read_program(path / PACKAGE_NAME)]
    from analyzer.convert.compress import compress_model

    out = []
    for i, plan in enumerate(plans):  # one conversion, compressed once per plan
        pkg = path / f"{i}.mlpackage"
        compress_model(mlmodel, plan).save(str(pkg))
        out.append(read_program(pkg))
    return out


def _analysis(source, variant: str, ctx: int, path, plans=()):
    model = build_value_free_model(source)
    untied = bool(plans) and needs_untie(plans[0]) and untie_embeddings_(model, copy_values=False)
    step = DecodeStep(model, ctx, variant, "state", lazy_cache=True).eval()
    out = []
    for plan in plans or (None,):  # a traced module converts once (coremltools lowers its graph in place)
        if out:
            for p in model.parameters():  # back to zero pages for the next trace
                p.data = zero_pages(p.shape)
        with ZeroPageProducts(model):  # as analysis mode traces (analyzer.convert.modes.value_free_programs)
            traced = trace_step(step)
        assign_value_free_weights_(model)
        prog = to_program(traced, step, keep_duplicate_consts=untied)
        if plan is not None:
            compress_program(prog, plan, path)
        out.append(walk_program(prog, path))
    return out


@pytest.mark.parametrize("preset", representatives(["exaone-4.0-1.2b", "llama-3.2-1b", "qwen3-0.6b"],
                                                    ("exaone-4.0-1.2b",)))
def test_two_layer_full_width_models_analyse_identically(preset, tmp_path):
    """Real hidden, intermediate and vocabulary sizes (tied embeddings, q/k norms, llama3 RoPE) at 2 layers."""
    source = resolve_source(preset, ["num_hidden_layers=2"])
    (m,) = _materialised(source, "repeat_kv", 64, tmp_path)
    (a,) = _analysis(source, "repeat_kv", 64, tmp_path)
    assert_same_analysis(a, m)
    assert len(a.tiles()) == 4 and a.path == ""


# top12 promotes the first and last 6 layers, top8 the first and last 4: at these sizes 2 layers keep the base rule
COMPRESSED_LAYERS = {"base": 14, "top8": 10, "top12": 14}


@pytest.mark.parametrize("preset", [pytest.param("base", marks=pytest.mark.full), "top8",
                                    pytest.param("top12", marks=pytest.mark.full)])
def test_compressed_structure_build_analyses_identically(preset, tmp_path):
    """Every compression preset on the structure config at 10 or 14 layers (Q-fold): coremltools' palettization and
    int8 passes lay out the value-free weights (a 16-entry fp16 LUT per 16 output channels with uint4 indices, 6-bit for
    the lm_head, int8 data with one fp16 scale per output channel) exactly as they lay out random ones.
    Only names coremltools generates from its op-name counters may differ: the state reads
    (``coreml_update_state_<n>``) and the gather-index fix-up it re-creates (greater_equal/add/select on one
    int32), because the materialised path reloads the program from protobuf before each of its two passes and
    numbers them again. Their types, layers, shapes and bytes are identical, and none reads a weight. base and
    top12 take the same code path as top8 with other layer rules; they run with QFOLD_FULL=1 (~2 min each)."""
    layers = COMPRESSED_LAYERS[preset]
    source = resolve_source(DEFAULT_PRESET, (*STRUCTURE_OVERRIDES, f"num_hidden_layers={layers}"))
    plan = parse_spec(preset, layers)
    (m,) = _materialised(source, "qfold", 256, tmp_path, [plan])
    (a,) = _analysis(source, "qfold", 256, tmp_path, [plan])
    assert_same_analysis(a, m, names=False)
    assert compression_report(a) == compression_report(m)
    renamed = {x.name for x, y in zip(a.ops, m.ops, strict=True) if x.name != y.name}
    assert {op.type for op in a.ops if op.name in renamed} <= {"read_state", "greater_equal", "add", "select", "const"}
    assert len(renamed) <= 2 * layers + 6
    assert not any(r.is_const and r.stored_bytes > 1024 for op in a.ops if op.name in renamed for r in op.inputs)
    assert compression_report(a).compressed_count == layers * 7 + 2  # every projection, embedding, lm_head


# ------------------------------------------------------------------------------------------------- build child
IDENTITY_OVERRIDES = (*STRUCTURE_OVERRIDES, "num_hidden_layers=4")  # the structure config's layer, 4 times


def test_structure_ab_in_one_process_equals_the_materialised_builds(builds_root):
    """The structure config (attention geometry, ctx 4096) at 4 layers: the analysis-mode A/B, both variants
    converted by one build child, equals the materialised builds op for op. Its 30 layers repeat this layer; the
    suite's 30-layer structure builds (conftest) are analysis-mode builds, which test_structure and test_shipped
    hold to the write-up's figures and the shipped full-size analyses."""
    source = resolve_source(DEFAULT_PRESET, IDENTITY_OVERRIDES)
    specs = {mode: [BuildSpec(source, v, "state", 4096, build_mode=mode) for v in ("repeat_kv", "qfold")]
             for mode in (ANALYSIS_MODE, "materialised")}
    every = [s for group in specs.values() for s in group]  # one child for both modes, as a user's request would
    paths = {s.key: r.path for s, r in zip(every, run_builds(every, builds_root), strict=True)}
    built = {mode: {s.variant: paths[s.key] for s in group} for mode, group in specs.items()}
    keys = [s.key for s in specs[ANALYSIS_MODE]]
    for variant, path in built[ANALYSIS_MODE].items():
        a, m = read_analysis_file(path), read_analysis_file(built["materialised"][variant])
        assert_same_analysis(a.program, m.program)
        assert a.summary == m.summary and a.bytes_per_token == m.bytes_per_token
        assert a.summary.tile_count == (8 if variant == "repeat_kv" else 0)
        assert a.build.build_mode == ANALYSIS_MODE and m.build.build_mode == "materialised"
        assert a.build.extra["built_together"] == keys  # both variants converted by one child
        # the second variant in a worker process beside the child when there is a core for it (issue 23)
        assert a.build.extra.get("converted_in_worker", False) == (variant == "qfold" and (os.cpu_count() or 1) > 1)
        assert not (path / PACKAGE_NAME).exists() and a.build.package_bytes is None
        assert a.program.path == "" and a.build.spec.to_json()["build_mode"] == ANALYSIS_MODE


def test_equivalence_is_checked_on_a_reduced_materialised_model_and_says_so(structure_builds):
    b = read_analysis_file(structure_builds["qfold"]).build
    torch_check = b.check("torch_variants")
    assert torch_check.checked and torch_check.bit_identical and not torch_check.covers_package_weights
    assert "reduced model" in torch_check.weights and "num_hidden_layers=2" in torch_check.weights
    assert "random weights" in torch_check.weights
    pairs = {p.dtype: p for p in b.equivalence.pairs}
    assert pairs["fp16"].bit_identical and pairs["fp32"].greedy_agree_steps == 8
    interp = b.check("interpreter_vs_torch")  # no package, no values: recorded as not run, never faked
    assert interp is not None and not interp.checked and interp.max_abs_diff is None
    assert "analysis-mode" in interp.note and "--mode materialised" in interp.note


@pytest.mark.parametrize("phase", ["prefill", "decode+prefill"])
def test_prefill_builds_analyse_identically_per_function(phase, builds_root, tiny_phase_builds):
    """A prefill build and a decode+prefill build (two functions) in analysis mode: one analysis per function,
    each equal to the materialised package's function (the materialised prefill-only build is made here)."""
    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    spec = BuildSpec(source, "repeat_kv", "state", TINY_CTX, phase=phase, q_len=TINY_Q_LEN)
    specs = [replace(spec, build_mode=ANALYSIS_MODE)] + ([spec] if phase == "prefill" else [])
    analysis, *made = (r.path for r in run_builds(specs, builds_root))  # the materialised prefill build made here
    materialised = made[0] if made else tiny_phase_builds["repeat_kv"]
    files_a, files_m = function_analysis_files(analysis), function_analysis_files(materialised)
    assert [f.name for f in files_a] == [f.name for f in files_m]
    for fa, fm in zip(files_a, files_m, strict=True):
        a, m = read_analysis_file(fa), read_analysis_file(fm)
        assert a.function == m.function
        assert_same_analysis(a.program, m.program)
        assert a.flops.per_token() == m.flops.per_token()
        assert a.build.check("torch_variants").checked
    assert not (analysis / PACKAGE_NAME).exists()
