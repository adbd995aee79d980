"""Issue 19's done-when for every GQA/MQA preset: each preset's own family and attention geometry (query heads, KV
heads, head dim) as a 2-layer config, converted to Core AI (repeat_kv, qfold, sdpa_gqa) and to Core ML (repeat_kv,
qfold), fp16, KV as state.

* Core AI repeat_kv: 2 replication ops per layer (K and V) of Hq·S·D·2 bytes each; with one KV head (MQA) K's only,
  because coreai-torch drops V's broadcast (the byte difference with Core ML is that copy, and ``diff`` says so);
  Q-fold: none; sdpa_gqa: 2 per layer inside the SDPA composite's fallback body, marked with the composite.
* kv_read, kv_write (and its value-semantics figure) and replication equal the Core ML build's; every other
  per-kind byte difference (``diff``: ``analyzer.compare.diff_reasons.explain``) has its cause read off the two graphs.

Cheap on purpose: each preset's 2-layer version (conftest ``preset_source``: hidden 256 wherever the family's config
takes a head_dim, MLP 256, vocab 512) at ctx 128, in-process. The Core ML side is the session's package of that
version (conftest ``preset_packages``, which test_families, test_fold_presets and test_interpret_presets convert
too); the Core AI side is exported with value-free weights (analysis mode, whose analyses are a materialised
build's op for op: tests/test_fast_identity.py, tests/test_coreai.py).
"""

from __future__ import annotations

import pytest

pytest.importorskip("coreai_torch")  # Core AI's wheels: Linux x86_64 cp311/cp312 and macOS arm64 only
import coreai.authoring  # noqa: F401  (before coreai._compiler.dialects: the other order is a circular import)

from analyzer.analysis.accounting import CATEGORIES
from analyzer.analysis.record import Analysis
from analyzer.compare.diff_reasons import explain
from analyzer.convert.coreai_build import export_step, save_asset, to_program
from analyzer.ir.coreai.walk import read_asset
from analyzer.ir.coreml.mil_reader import read_program
from analyzer.model.decode import DecodeStep
from analyzer.model.sources import geometry_of, list_presets, load_config, resolve_source
from analyzer.model.valuefree import assign_value_free_weights_, build_value_free_model
from tests.conftest import PRESET_CTX, preset_source, representatives
from tests.test_coreai import assert_causes_read_off_the_graphs

pytestmark = pytest.mark.conversion
CTX = PRESET_CTX  # the session's packages' (conftest ``preset_packages``)
GEOMETRIES = {p.name: geometry_of(load_config(resolve_source(p.name))) for p in list_presets()}
GQA_PRESETS = sorted(name for name, g in GEOMETRIES.items() if g.num_kv_heads < g.num_q_heads)
SAME_BYTES = ("kv_read", "kv_write", "kv_write_value_semantics")


def convert_both(preset: str, tmp_path, preset_packages) -> tuple[dict[str, Analysis], dict[str, Analysis]]:
    """(Core ML analyses, Core AI analyses) by variant: the session's Core ML packages of the preset's 2-layer
    version, and its Core AI steps exported with value-free weights, as an analysis-mode build exports them."""
    coreml = {v: Analysis(read_program(preset_packages(preset, v))) for v in ("repeat_kv", "qfold")}
    model = build_value_free_model(preset_source(preset))
    assign_value_free_weights_(model)
    coreai = {}
    for v in ("repeat_kv", "qfold", "sdpa_gqa"):
        step = DecodeStep(model, CTX, v, "state", lazy_cache=True).eval()
        save_asset(to_program(export_step(step), step), tmp_path / f"{v}.aimodel")
        coreai[v] = Analysis(read_asset(tmp_path / f"{v}.aimodel"))
    return coreml, coreai


def kv_copies(a: Analysis):
    return [t for t in a.summary.tiles if t.kind == "kv_replication"]


# the default, the 70B (8 of 64 heads) and gemma (its own head_dim and query scale); every preset: QFOLD_EXTENDED=1
@pytest.mark.parametrize("preset", representatives(GQA_PRESETS, ("exaone-4.0-1.2b", "gemma-3-1b", "llama-3.1-70b")))
def test_every_gqa_preset_on_both_backends(preset, tmp_path, preset_packages):
    g = GEOMETRIES[preset]
    small = geometry_of(load_config(preset_source(preset)))
    assert (small.num_q_heads, small.num_kv_heads, small.head_dim, small.num_layers) == \
        (g.num_q_heads, g.num_kv_heads, g.head_dim, 2)
    coreml, coreai = convert_both(preset, tmp_path, preset_packages)
    copy = g.num_q_heads * CTX * g.head_dim * 2  # Hq·S·D·2 bytes
    mqa = g.num_kv_heads == 1

    rk = kv_copies(coreai["repeat_kv"])
    assert [t.layer for t in rk] == ([0, 1] if mqa else [0, 0, 1, 1])  # MQA: K's copy only
    assert {t.output_bytes for t in rk} == {copy} and all(t.composite is None for t in rk)
    sdpa = kv_copies(coreai["sdpa_gqa"])
    assert [t.layer for t in sdpa] == [0, 0, 1, 1] and {t.output_bytes for t in sdpa} == {copy}
    assert {t.composite for t in sdpa} == {"scaled_dot_product_attention"}
    assert kv_copies(coreai["qfold"]) == [] and coreai["qfold"].bytes_per_token.replication == 0
    assert [t.output_bytes for t in kv_copies(coreml["repeat_kv"])] == [copy] * 4 and kv_copies(coreml["qfold"]) == []

    for v in ("repeat_kv", "qfold"):
        ml, ai = coreml[v], coreai[v]
        for k in SAME_BYTES:
            assert ml.bytes_per_token.get(k) == ai.bytes_per_token.get(k), (v, k)
        reasons = explain(ml, ai)
        for c in CATEGORIES:  # every byte of every category is in exactly one part
            assert sum(r.delta for r in reasons if r.aspect == c) == \
                ai.bytes_per_token.get(c) - ml.bytes_per_token.get(c), (v, c)
        assert_causes_read_off_the_graphs(reasons, ml, ai)
        replication = ai.bytes_per_token.replication - ml.bytes_per_token.replication
        if v == "repeat_kv" and mqa:  # V's copy per layer, written and read once more, and nothing else
            assert replication == -2 * copy * small.num_layers
            (tile,) = [r for r in reasons if (r.aspect, r.kind) == ("replication", "tile")]
            layers = small.num_layers  # Core ML copies K and V, Core AI K only: the cause counts them
            assert f"{2 * layers} tile ops in A (tile ({2 * layers})), {layers} in B" in tile.why, tile.why
        else:
            assert replication == 0, v
