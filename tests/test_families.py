"""One mechanism for every family: torch equivalence of the variants, and tiles = 2 × layers of Hq·ctx·D·2
bytes for every GQA preset, 0 for MHA, MQA included (real conversions of 2-layer versions)."""

import pytest
import torch

from analyzer.analysis.accounting import account
from analyzer.convert.child import convert_step
from analyzer.errors import SourceError
from analyzer.ir.coreml.mil_reader import read_program
from analyzer.model.decode import DecodeStep, build_model
from analyzer.model.equivalence import check_equivalence
from analyzer.model.sources import geometry_of, load_config, resolve_source
from tests.conftest import PRESET_CTX, preset_source

# Two layers, small MLP, vocab and (where the config allows) hidden size; head geometry stays the preset's own.
GQA = ["exaone-4.0-1.2b", "llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "mistral-7b-v0.3", "gemma-3-1b"]
CTX = PRESET_CTX


def _model(preset, extra=()):
    return build_model(preset_source(preset, extra))


@pytest.mark.parametrize("preset", [*GQA, "phi-3-mini-4k"])
def test_variants_agree_with_each_other_and_with_the_family(preset):
    report = check_equivalence(_model(preset), "state", ctx=32, steps=8)
    pairs = {p.dtype: p for p in report.pairs}
    assert pairs["fp16"].bit_identical, preset
    assert pairs["fp32"].greedy_agree_steps == 8 and pairs["fp32"].max_abs_diff < 1e-4
    assert report.reference.greedy_agree_steps == 8


@pytest.mark.parametrize("kv_mode", ["state", "input"])
def test_sliding_window_layers_get_their_window(kv_mode):
    """Gemma 3 slides 5 of 6 layers; with a window shorter than the decoded run the decode step must still
    match the family's own forward."""
    model = _model("gemma-3-1b", ["sliding_window=4", "num_hidden_layers=6"])
    report = check_equivalence(model, kv_mode, ctx=16, steps=12)
    assert report.reference.max_abs_diff < 1e-4
    assert {p.dtype: p for p in report.pairs}["fp16"].bit_identical


def test_query_heads_not_contiguous_per_group_are_detected(monkeypatch):
    """A family that pairs query head h with KV head h % Hkv (interleaved) cannot be folded by reshape."""
    from transformers.models.llama import modeling_llama

    model = _model("llama-3.2-1b", ["head_dim=64"])
    monkeypatch.setattr(modeling_llama, "repeat_kv", lambda x, n: x.repeat(1, n, 1, 1))
    with pytest.raises(SourceError, match="not contiguous per KV group"):
        check_equivalence(model, "state", ctx=16, steps=4)


@pytest.mark.conversion
@pytest.mark.parametrize("preset", [*GQA, "phi-3-mini-4k"])
def test_tiles_are_two_per_layer_of_hq_ctx_d_fp16(preset, preset_packages):
    g = geometry_of(load_config(preset_source(preset)))
    counts = {}
    for variant in ("repeat_kv", "qfold"):
        program = read_program(preset_packages(preset, variant))
        tiles = program.tiles()
        counts[variant] = len(tiles)
        if variant == "repeat_kv" and g.group_size > 1:
            assert len(tiles) == 2 * g.num_layers
            assert {t.tile_kind for t in tiles} == {"kv_replication"}
            assert {t.output_bytes for t in tiles} == {g.num_q_heads * CTX * g.head_dim * 2}
            assert account(program).totals()["replication"] == 2 * len(tiles) * g.num_q_heads * CTX * g.head_dim * 2
        assert program.op_counts()["slice_update"] == 2 * g.num_layers
    assert counts["qfold"] == 0
    if g.group_size == 1:  # MHA: nothing to replicate in either variant
        assert counts["repeat_kv"] == 0


@pytest.mark.conversion
def test_kv_as_input_replicates_cache_and_new_token(tmp_path):
    model = _model("exaone-4.0-1.2b", ["hidden_size=256"])
    g = geometry_of(model.config)
    path = tmp_path / "input.mlpackage"
    convert_step(DecodeStep(model, CTX, "repeat_kv", "input").eval()).save(str(path))
    program = read_program(path)
    assert {t.name for t in program.inputs} >= {"k_cache_0", "v_cache_1", "causal_mask"}
    assert not program.states
    big = [t for t in program.tiles() if t.output_bytes == g.num_q_heads * CTX * g.head_dim * 2]
    small = [t for t in program.tiles() if t.output_bytes == g.num_q_heads * g.head_dim * 2]
    assert len(big) == len(small) == 2 * g.num_layers
    assert {t.tile_kind for t in program.tiles()} == {"kv_replication"}
    t = account(program).totals()
    assert t["kv_read"] == 2 * g.num_layers * g.num_kv_heads * CTX * g.head_dim * 2
    assert t["kv_write"] == 2 * g.num_layers * g.num_kv_heads * g.head_dim * 2  # new_k / new_v outputs


def test_mqa_geometry():
    g = geometry_of(load_config(resolve_source("gemma-3-1b")))
    assert g.num_kv_heads == 1 and g.group_size == 4


def test_decode_step_matches_with_input_kv():
    model = _model("qwen3-0.6b")
    a = check_equivalence(model, "input", ctx=32, steps=6)
    assert {p.dtype: p for p in a.pairs}["fp16"].bit_identical
    assert torch.tensor(a.reference.max_abs_diff) < 1e-4
