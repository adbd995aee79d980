"""Core AI builds' shortcuts (analyzer.convert.coreai_quick) make the asset coreai-torch's own path makes, byte for
byte, and an analysis-mode A/B converts its second variant in a worker with the analysis of a build made alone."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("coreai_torch")
import coreai.authoring  # noqa: F401  (before coreai._compiler.dialects: the other order is a circular import)

from analyzer.analysis.record import load_analysis
from analyzer.convert import coreai_build
from analyzer.convert.coreai_quick import is_one_value_view, one_value_converter
from analyzer.convert.launch import run_builds
from analyzer.convert.modes import make_step
from analyzer.model.sources import DEFAULT_PRESET, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, MATERIALISED_MODE, BuildSpec
from tests.conftest import TINY_CTX, TINY_OVERRIDES
from tests.test_fast_identity import assert_same_analysis


def program_text(asset) -> str:
    """The saved program's MLIR with its debug locations, private graphs (an SDPA composite's body) named by their
    order: coreai-torch names each with random letters (``@sdpa_iboezuot``), so two conversions of one step differ
    there and only there."""
    from coreai._compiler._mlir_libs._coreaiIR._bindings.compiler import load_module_from_bytecode
    from coreai.authoring.context import Context

    module = load_module_from_bytecode(context=Context()._mlir_context, path=asset / "main.mlirb")
    text = module.operation.get_asm(enable_debug_info=True)
    for i, name in enumerate(dict.fromkeys(re.findall(r"coreai\.graph private[^@]*@([\w$.-]+)\(", text))):
        text = re.sub(rf"@{re.escape(name)}\b", f"@private_graph_{i}", text)
    return text


def _saved_program(spec: BuildSpec, converter, tmp_path) -> str:
    model, _ = coreai_build.model_for(spec)
    step = make_step(model, spec, spec.phase, lazy_cache=spec.build_mode == ANALYSIS_MODE)
    program = coreai_build.to_program(coreai_build.export_step(step), step, converter)
    asset = tmp_path / f"{len(list(tmp_path.iterdir()))}.aimodel"
    coreai_build.save_asset(program, asset)
    return program_text(asset)


@pytest.mark.parametrize(("variant", "kv_mode", "phase", "mode"), [
    ("repeat_kv", "state", "decode", ANALYSIS_MODE),
    pytest.param("sdpa_gqa", "input", "decode", ANALYSIS_MODE, marks=pytest.mark.extended),
    pytest.param("qfold", "state", "prefill", ANALYSIS_MODE, marks=pytest.mark.extended),
    ("qfold", "state", "decode", MATERIALISED_MODE),
])
def test_one_value_constants_save_the_same_bytecode(variant, kv_mode, phase, mode, tmp_path):
    """The saved program (its MLIR: ops, constants, debug locations) is the same with the shortcut as with
    coreai-torch's own constants; in materialised mode no weight is one value, so it is a no-op."""
    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    spec = BuildSpec(source, variant, kv_mode, TINY_CTX, backend="coreai", build_mode=mode, phase=phase,
                     q_len=1 if phase == "decode" else 8)
    assert _saved_program(spec, None, tmp_path) == _saved_program(spec, one_value_converter(), tmp_path)


def test_what_counts_as_one_value():
    one = torch.full((), 0.5, dtype=torch.float16).expand(4, 3)
    assert is_one_value_view(one) and is_one_value_view(one.t())
    assert not is_one_value_view(one.contiguous())  # materialised: its values are read as coreai-torch reads them
    assert not is_one_value_view(torch.full((), 0.5).expand(1, 1))  # one element: nothing to save
    assert not is_one_value_view(torch.full((), 0.5, dtype=torch.bfloat16).expand(4))  # coreai-torch's own path


def test_an_analysis_ab_converts_its_second_variant_in_a_worker(tmp_path):
    """Three layers: larger than the reduced model, so the A/B's qfold converts in a worker beside the child; its
    analysis is the one a build of qfold alone makes, op for op."""
    source = resolve_source(DEFAULT_PRESET, (*TINY_OVERRIDES, "num_hidden_layers=3"))
    specs = [BuildSpec(source, v, "state", TINY_CTX, backend="coreai", build_mode=ANALYSIS_MODE)
             for v in ("repeat_kv", "qfold")]
    ab = run_builds(specs, tmp_path / "ab")
    alone = run_builds(specs[1:], tmp_path / "alone")
    in_worker = load_analysis(ab[1].path)
    assert in_worker.build.extra.get("converted_in_worker") is True
    assert load_analysis(ab[0].path).build.extra.get("converted_in_worker") is None
    assert_same_analysis(in_worker.program, load_analysis(alone[0].path).program)
