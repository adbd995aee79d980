"""Compressed Core AI builds (issue 41), on real conversions: the tiny config (2 layers of the default geometry, ctx
256) as a compressed Core AI A/B (``ffn=pal4,attn=int8``, coreai-opt 0.4.0) in fp16 and fp32, and the Core ML build
of the same spec beside it (analysis mode), all converted by one child.

What is checked against what, independently of qfold's walk and byte rules: the asset's constants are read with
coreai-core's own loader (their stored sizes from its ``copy_constant_value_to_array``, in a child process), the
runtime's profiler says whether decompression runs per call, and the runtime's outputs compare the variants.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from analyzer.analysis.accounting import account
from analyzer.analysis.compression import compression_report, weights_by_part
from analyzer.analysis.record import load_analysis
from analyzer.cli import main as cli
from analyzer.compare.diff_reasons import explain
from analyzer.convert.launch import run_builds
from analyzer.engines.coreai.runtime import FP16_TOLERANCE, CoreAIRuntime
from analyzer.engines.interpret import decode_feeds, decode_steps
from analyzer.errors import QfoldError
from analyzer.ir.coreai.dialect import PER_CALL_DECOMPRESSION
from analyzer.model import backends
from analyzer.model.sources import DEFAULT_PRESET, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, BuildSpec
from tests.conftest import TINY_CTX, TINY_OVERRIDES

pytest.importorskip("coreai_opt")  # coreai-opt carries coreai-core's markers: Linux x86_64 and macOS arm64 only

SPEC = "ffn=pal4,attn=int8,embed=fp16,lm_head=fp16"
VARIANTS = ("repeat_kv", "qfold")
STEPS = 4


@pytest.fixture(scope="module")
def builds(builds_root) -> dict[tuple[str, str], Path]:
    """(backend/weights, variant) → build folder: the compressed Core AI A/B in fp16 and fp32 and the Core ML A/B
    of the same spec, in one child."""
    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    specs = {("coreai", v): BuildSpec(source, v, "state", TINY_CTX, SPEC, backend="coreai") for v in VARIANTS}
    specs |= {("coreai-fp32", v): BuildSpec(source, v, "state", TINY_CTX, SPEC, backend="coreai", weights="fp32")
              for v in VARIANTS}
    specs |= {("coreml", v): BuildSpec(source, v, "state", TINY_CTX, SPEC, build_mode=ANALYSIS_MODE)
              for v in VARIANTS}
    results = run_builds(list(specs.values()), builds_root)
    return {k: r.path for k, r in zip(specs, results, strict=True)}


def test_the_ab_builds_inspects_diffs_and_benches(builds, capsys, tmp_path):
    ai, ml = builds[("coreai", "qfold")], builds[("coreml", "qfold")]
    a = load_analysis(ai)
    assert a.build.spec.compression == SPEC and a.program.backend == "coreai"
    types = Counter(op.type for op in a.program.ops)
    # 2 layers: 3 FFN weights palettized, 4 attention projections quantized, each to one decompression op
    assert types["coreai.lut_to_dense"] == 6 and types["coreai.blockwise_shift_scale"] == 8
    report = compression_report(a.program)
    assert report.layers_by_scheme("ffn") == {"pal4": (0, 1)} and report.layers_by_scheme("attn") == {"int8": (0, 1)}
    ffn = next(w for w in report.weights if w.parts == ("ffn",))
    assert ffn.granularity == "per-grouped-channel 16" and ffn.stored_dtypes == "indices uint4, lut fp16"

    assert cli(["inspect", str(ai)]) == 0
    assert "attention weights as stored: int8 in layers 0-1" in capsys.readouterr().out

    assert cli(["diff", str(ml), str(ai), "--json"]) == 0
    reasons = {(r["aspect"], r["kind"]): r for r in json.loads(capsys.readouterr().out)["reasons"]}
    lut = reasons[("weights", "coreai.lut_to_dense")]
    assert lut["a"] == 0 and lut["b"] > 0 and "B decompresses weights on every call (coreai.lut_to_dense (6))" \
        in lut["why"] and "where A decompresses its weights once, at load (" in lut["why"], lut["why"]
    assert "B decompresses weights on every call (coreai.blockwise_shift_scale (8))" in \
        reasons[("activations", "coreai.blockwise_shift_scale")]["why"]
    # the twin stores the same parts the same way: nothing "stored differently" to name between fp16 twins ...
    assert "stored differently" not in lut["why"]
    # ... while the fp32 Core AI build stores its LUTs and scales in fp32
    fp32 = {(r.aspect, r.kind): r for r in explain(load_analysis(ml), load_analysis(builds[("coreai-fp32", "qfold")]))}
    assert "lut fp32" in fp32[("weights", "coreai.lut_to_dense")].why
    assert "scale fp32" in fp32[("weights", "coreai.blockwise_shift_scale")].why

    out = tmp_path / "bench.csv"
    assert cli(["bench", str(builds[("coreai", "repeat_kv")]), str(ai), "--steps", "2", "--rounds", "1",
                "--out", str(out)]) == 0
    assert len(out.read_text().strip().splitlines()) == 3  # a header and one row per build


@pytest.mark.parametrize("weights", ["coreai", "coreai-fp32"])
def test_qfold_equals_repeat_kv_on_the_runtime(builds, weights):
    with CoreAIRuntime() as rt:
        runs = {}
        for v in VARIANTS:
            m = rt.load(builds[(weights, v)] / "model.aimodel")
            runs[v] = decode_steps(m, STEPS, seed=3)
    a, b = (np.stack([o["logits"] for o in runs[v].outputs]).astype(np.float32) for v in VARIANTS)
    if weights == "coreai-fp32":
        assert np.array_equal(a, b)  # bit-identical
    else:
        assert np.max(np.abs(a - b)) <= FP16_TOLERANCE * np.max(np.abs(a))
    # the compressed weights are the same in both variants (coreai-opt is deterministic on the same weights)
    ra, rb = (compression_report(load_analysis(builds[(weights, v)]).program) for v in VARIANTS)
    assert [(w.parts, w.layer, w.stored_bytes) for w in ra.weights] == [(w.parts, w.layer, w.stored_bytes)
                                                                        for w in rb.weights]
    # the torch check says it ran on uncompressed weights
    check = load_analysis(builds[(weights, "qfold")]).build.checks[0]
    assert not check.covers_package_weights and "uncompressed" in check.note


# Stored bytes of each constant of an asset's main graph, read with coreai-core's loader, in a child process: the
# smallest buffer copy_constant_value_to_array accepts (a splat: one element), with each constant's readers.
_READ_ASSET = r'''
import json, sys
from pathlib import Path
import numpy as np
import coreai.authoring
from coreai._compiler._mlir_libs._coreaiIR import _bindings
from coreai._compiler._mlir_libs._coreaiIR._bindings.compiler import load_module_from_bytecode
from coreai._compiler.ir import DenseElementsAttr
from coreai.authoring.context import Context
module = load_module_from_bytecode(context=Context()._mlir_context, path=Path(sys.argv[1]) / "main.mlirb")
graph = next(op.operation for op in module.body.operations if op.operation.name == "coreai.graph")
def fits(op, n):
    try:
        _bindings.compiler.copy_constant_value_to_array(constant_op=op, destination=np.zeros(n, np.uint8))
        return True
    except Exception:
        return False
rows = []
for op in graph.regions[0].blocks[0].operations:
    op = op.operation
    if op.name != "coreai.constant":
        continue
    t = op.results[0].type
    try:
        attr = DenseElementsAttr(op.attributes["value"])
        splat, zero = attr.is_splat, attr.is_splat and float(np.array(attr).flat[0]) == 0.0
    except Exception:
        splat = zero = False
    lo, hi = 0, 1 << 31
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(op, mid) else (mid + 1, hi)
    stored = (t.element_type.width + 7) // 8 if splat else lo
    rows.append({"shape": list(t.shape), "stored": stored, "zero": zero,
                 "readers": [[u.owner.name, u.operand_number] for u in op.results[0].uses]})
print(json.dumps(rows))
'''


def test_weight_bytes_are_the_stored_constants_compute_ops_read(builds):
    """Weight bytes per token = the stored bytes of the compressed constants the decompression ops read, plus the
    fp16 tables (the embedding charged one gathered row, the tied lm_head the whole table through its transpose),
    plus small constants (norm scales, RoPE): each checked against the asset as coreai-core reads it."""
    path = builds[("coreai", "qfold")]
    rows = json.loads(subprocess.run([sys.executable, "-c", _READ_ASSET, str(path / "model.aimodel")], check=True,
                                     capture_output=True, text=True, timeout=300).stdout)
    reads = lambda r, *names: [x for x, _ in r["readers"] if x in names]  # noqa: E731
    compressed = sum(r["stored"] for r in rows if not r["zero"] and len(r["shape"]) >= 1
                     and reads(r, "coreai.lut_to_dense", "coreai.blockwise_shift_scale"))
    (table,) = [r for r in rows if reads(r, "coreai.gather_nd")]
    vocab = table["shape"][0]
    a = load_analysis(path)
    acct = a.account
    ops = a.program.ops
    at = lambda *types: sum(r.weights for r in acct.ops if ops[r.index].type in types)  # noqa: E731
    assert at(*PER_CALL_DECOMPRESSION) == compressed
    assert at("coreai.gather_nd") == table["stored"] // vocab  # one gathered row of the fp16 table
    assert at("coreai.transpose") == table["stored"]  # the tied lm_head reads the whole table
    small = acct.per_token().weights - compressed - table["stored"] - table["stored"] // vocab
    assert 0 < small < 0.01 * acct.per_token().weights  # norm scales and the like, nothing else
    by_part = weights_by_part(a.program, acct)
    assert by_part["attn"] + by_part["ffn"] == compressed and by_part["embed"] == table["stored"] // vocab
    assert by_part["lm_head"] == table["stored"]


def test_decompression_runs_per_call_and_the_weight_charge_keeps_its_meaning(builds):
    path = builds[("coreai", "repeat_kv")]
    a = load_analysis(path)
    n_ops = Counter(op.type for op in a.program.ops if op.type in PER_CALL_DECOMPRESSION)
    with CoreAIRuntime() as rt:
        m = rt.load(path / "model.aimodel")
        profile = m.profile(decode_feeds(m, 2))
    events = Counter()
    for o in profile.ops:
        events[o.event.removeprefix("call.")] += o.count
    assert {t: events[t] for t in n_ops} == {t: 2 * n for t, n in n_ops.items()}  # every op, every call

    compressed, decompressed = account(a.program), account(a.program, "decompressed")
    rows = {r.index: r for r in compressed.ops}
    dense = sum(op.output_bytes for op in a.program.ops if op.type in PER_CALL_DECOMPRESSION)
    stored = sum(rows[op.index].weights for op in a.program.ops if op.type in PER_CALL_DECOMPRESSION)
    # per call: the dense weights are written and read again (activations); at load: read as weights, once
    assert sum(rows[op.index].activations for op in a.program.ops if op.type in PER_CALL_DECOMPRESSION) == dense
    c, d = compressed.per_token(), decompressed.per_token()
    assert d.weights - c.weights == dense - stored
    assert c.activations - d.activations == 2 * dense


def test_refusals(monkeypatch):
    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    with pytest.raises(QfoldError, match="op for op"):
        BuildSpec(source, "qfold", "state", TINY_CTX, SPEC, backend="coreai", build_mode=ANALYSIS_MODE)
    monkeypatch.setattr(backends, "COREAI_OPT_PALETTE_BITS", (1, 2, 3, 4, 8))
    with pytest.raises(QfoldError, match=r"lm_head = pal6: coreai-opt palettizes with n_bits in 1, 2, 3, 4, 8"):
        BuildSpec(source, "qfold", "state", TINY_CTX, "ffn=pal4,attn=pal4,embed=pal4,lm_head=pal6", backend="coreai")
    with pytest.raises(QfoldError, match=r"ffn of layers 0-1 = pal6"):
        BuildSpec(source, "qfold", "state", TINY_CTX, "ffn=pal6,attn=fp16,embed=fp16,lm_head=fp16", backend="coreai")
    monkeypatch.setattr(backends, "coreai_opt_available", lambda: False)
    with pytest.raises(QfoldError, match=r"coreai-opt==0\.4\.0"):
        backends.require_coreai(compression=True)
    backends.require_coreai()  # an uncompressed Core AI build does not need coreai-opt


def test_a_tied_table_given_two_schemes_is_untied(tmp_path):
    """The tiny model ties its embedding and lm_head; embed=pal4, lm_head=pal6 (as top8 gives EXAONE) unties them in
    torch, so each table is compressed as its rule says (one scheme keeps the one table: the A/B above)."""
    import torch

    from analyzer.convert.compress.coreai_apply import compress_coreai_program
    from analyzer.convert.coreai_build import export_step, save_asset, to_program
    from analyzer.convert.modes import _untie_if_needed
    from analyzer.ir.coreai.walk import read_asset
    from analyzer.model.compress_spec import parse_spec
    from analyzer.model.decode import DecodeStep, build_model
    from analyzer.model.linear_layout import pretranspose_linears_

    def parts(spec: str) -> dict[str, str]:
        model = build_model(resolve_source(DEFAULT_PRESET, [*TINY_OVERRIDES, "vocab_size=128"]), torch.float16)
        plan = parse_spec(spec, 2)
        untied = _untie_if_needed(model, plan, copy_values=True)
        pretranspose_linears_(model)
        step = DecodeStep(model, 64, "qfold", "state").eval()
        program = to_program(export_step(step), step)
        compress_coreai_program(program, plan)
        out = tmp_path / f"{len(list(tmp_path.iterdir()))}.aimodel"
        save_asset(program, out)
        report = compression_report(read_asset(out))
        return {"+".join(w.parts): w.scheme for w in report.weights if {"embed", "lm_head"} & set(w.parts)}, untied

    assert parts("ffn=fp16,attn=fp16,embed=pal4,lm_head=pal6") == ({"embed": "pal4", "lm_head": "pal6"}, True)


def test_the_ab_page_shows_both_backends_pairs_of_one_spec(builds):
    from analyzer.report.catalog import build_refs
    from analyzer.report.twins import backend_twin, twin_figure, twin_frame
    from tests.test_app import open_page, texts

    refs = build_refs()
    by_path = {r.path: r for r in refs}
    ml = tuple(by_path[builds[("coreml", v)]] for v in VARIANTS)
    ai = backend_twin(ml, refs)
    assert ai is not None and [r.facts.backend for r in ai] == ["coreai"] * 2 and [r.variant for r in ai] == [*VARIANTS]
    back = backend_twin(ai, refs)
    assert back is not None and [r.facts.backend for r in back] == ["coreml"] * 2
    four = {(r.facts.backend, r.variant): load_analysis(r.path) for r in (*ml, *ai)}
    frame = twin_frame(four).set_index("category")
    for (backend, variant), a in four.items():
        assert frame.loc["weights", f"{backend}_{variant}"] == a.bytes_per_token.weights
    fig = twin_figure(frame.reset_index(), SPEC)
    assert [t.name for t in fig.data] == ["Core ML · repeat_kv", "Core ML · qfold", "Core AI · repeat_kv",
                                          "Core AI · qfold"]

    at = open_page(ab_a=ml[0].id, ab_b=ml[1].id)
    assert any("The same A/B on Core AI" in e.label for e in at.expander)
    assert any("qfold diff" in c for c in texts(at.caption))


def test_an_asset_coreai_opt_compressed_per_block_is_read_back_and_runs(tmp_path, capsys):
    """An asset compressed as coreai-opt documents it (docs/src/utils/coreai_compression.md: quantize_weights on the
    whole program), not by qfold: int4 per block of 32 input channels, fp16 scales. The walk reads it back as
    stored, and Apple's runtime runs it."""
    import torch
    from coreai_opt.coreai_utils import CompressionGranularity, DType, quantize_weights

    from analyzer.convert.coreai_build import export_step, save_asset, to_program
    from analyzer.ir.coreai.walk import read_asset
    from analyzer.model.decode import DecodeStep, build_model

    model = build_model(resolve_source(DEFAULT_PRESET, [*TINY_OVERRIDES, "vocab_size=128", "num_hidden_layers=1"]),
                        torch.float16)
    step = DecodeStep(model, 64, "qfold", "state").eval()
    program = to_program(export_step(step), step)
    quantize_weights(program, DType.INT4, granularity=CompressionGranularity.PER_BLOCK, block_size=32,
                     in_place=True)
    out = tmp_path / "int4.aimodel"
    save_asset(program, out)
    report = compression_report(read_asset(out))
    q = [w for w in report.weights if w.compressed]
    assert q and all(w.scheme == "int4" and w.granularity.startswith("per-block") and "x32" in w.granularity
                     and w.stored_dtypes == "data int4, scale fp16" and w.bits_per_weight == 4.5 for w in q)
    assert cli(["run", str(out), "--steps", "2", "--out", str(tmp_path / "o.npz")]) == 0
    assert np.isfinite(np.load(tmp_path / "o.npz")["logits"]).all()
