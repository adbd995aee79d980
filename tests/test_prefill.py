"""Prefill (q_len N > 1) for every family: both variants agree with each other and with the family's own forward
over a whole prompt (torch), and in the converted MIL the Q-fold prefill has no KV-replication tile and no op of
rank > 4 while repeat_kv has 2 per layer (none for the MHA preset); the FLOPs of every matmul are derived from
the config by hand."""

import pytest
import torch

from analyzer.analysis.flops import count_flops
from analyzer.convert.child import convert_step
from analyzer.errors import SourceError
from analyzer.ir.coreml.mil_reader import read_program
from analyzer.model.decode import build_model
from analyzer.model.equivalence import check_prefill_equivalence, prefill_tokens
from analyzer.model.prefill import PrefillStep, make_prefill_mask, run_prefill
from analyzer.model.sources import geometry_of, resolve_source
from analyzer.predict.roofline import prompt_calls
from tests.conftest import representatives

N, CTX = 64, 128  # two prefill calls fill the cache; the second reads what the first wrote
BASE = ["num_hidden_layers=2", "intermediate_size=256", "vocab_size=512"]
# Small hidden sizes where the preset fixes head_dim (so the attention geometry stays the preset's); qwen2.5 and
# phi-3 derive head_dim from hidden / heads, so they keep a hidden size that keeps (qwen2.5) or shrinks (phi-3) it.
SHRINK = {
    "exaone-4.0-1.2b": ["hidden_size=256"], "llama-3.2-1b": ["hidden_size=256"], "mistral-7b-v0.3": ["hidden_size=256"],
    "qwen3-0.6b": ["hidden_size=256"], "gemma-3-1b": ["hidden_size=256"], "qwen2.5-0.5b": [],
    "phi-3-mini-4k": ["hidden_size=512"],
}
GQA = ["exaone-4.0-1.2b", "llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "mistral-7b-v0.3", "gemma-3-1b"]
PRESETS = [*GQA, "phi-3-mini-4k"]
REL_TOL = 1e-2  # the bound: max |Δ| ≤ 1e-2 × max |output| over a full prompt


def _model(preset, extra=()):
    return build_model(resolve_source(preset, [*BASE, *SHRINK[preset], *extra], seed=5))


@pytest.mark.parametrize("preset", PRESETS)
def test_variants_agree_over_a_whole_prompt(preset):
    report = check_prefill_equivalence(_model(preset), "state", CTX, N)  # raises if not the family's own attention
    assert (report.phase, report.q_len, report.steps) == ("prefill", N, prefill_tokens(CTX, N)) == ("prefill", N, CTX)
    scale = report.reference.max_abs_logit
    for pair in report.pairs:
        assert pair.max_abs_diff <= REL_TOL * scale, (preset, pair)
    fp32 = next(p for p in report.pairs if p.dtype == "fp32")
    assert fp32.greedy_agree_steps == CTX and fp32.max_abs_diff < 1e-4
    assert report.reference.greedy_agree_steps == CTX
    assert "128-token prompt in 2 prefill call(s) of 64" in report.what


@pytest.mark.parametrize("kv_mode", ["state", "input"])
def test_sliding_window_rows_and_a_read_only_cache(kv_mode):
    """Gemma 3 slides 5 of 6 layers: with a window shorter than a call, each prompt row needs its own window
    (built in-graph from current_pos); with the cache as inputs the new tokens are causal among themselves."""
    model = _model("gemma-3-1b", ["sliding_window=6", "num_hidden_layers=6"])
    report = check_prefill_equivalence(model, kv_mode, 32, 8)
    assert report.reference.max_abs_diff < 1e-4
    assert all(p.max_abs_diff <= REL_TOL * report.reference.max_abs_logit for p in report.pairs)


def test_prefill_then_decode_continues_the_same_cache():
    """What a prefill call writes is what a decode step reads: prefill 8 tokens, decode the 9th, against the
    family's own forward over all 9."""
    from analyzer.model.decode import DecodeStep, make_mask

    model = _model("exaone-4.0-1.2b")
    tokens = list(range(3, 12))
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0, -1]
        for variant in ("repeat_kv", "qfold"):
            pre = PrefillStep(model, 16, variant, "state", 8, cache_dtype=torch.float32)
            run_prefill(pre, tokens[:8], torch.float32)
            dec = DecodeStep(model, 16, variant, "state", cache_dtype=torch.float32)
            for i in range(geometry_of(model.config).num_layers):  # the decode step reads the prefill's cache
                for kv in "kv":
                    getattr(dec, f"{kv}_cache_{i}").copy_(getattr(pre, f"{kv}_cache_{i}"))
            logits = dec(torch.tensor([[tokens[8]]], dtype=torch.int32), torch.tensor([8], dtype=torch.int32),
                         make_mask(16, 8, torch.float32, include_current=True))
            assert float((logits[0, -1] - ref).abs().max()) < 1e-4, variant


def test_bad_prefill_requests_fail_specifically():
    model = _model("llama-3.2-1b")
    with pytest.raises(SourceError, match="q_len 1: must be an integer from 2 to ctx=16"):
        PrefillStep(model, 16, "qfold", "state", 1)
    with pytest.raises(SourceError, match="from 2 to ctx=16"):
        PrefillStep(model, 16, "qfold", "state", 32)
    with pytest.raises(ValueError, match="multiple of q_len=8"):
        run_prefill(PrefillStep(model, 16, "qfold", "state", 8), [1, 2, 3], torch.float32)
    assert prompt_calls(129, 64) == 3 and prompt_calls(64, 64) == 1


def test_masks_are_causal_per_row():
    m = make_prefill_mask(6, 2, 3, torch.float32, "state")[0, 0]  # rows at positions 2, 3, 4 of a 6-slot cache
    assert [(row == 0).sum().item() for row in m] == [3, 4, 5]
    m = make_prefill_mask(6, 2, 3, torch.float32, "input")[0, 0]  # 6 cache slots (2 filled), then 3 new tokens
    assert m.shape == (3, 9)
    assert [(row == 0).nonzero().flatten().tolist() for row in m] == [[0, 1, 6], [0, 1, 6, 7], [0, 1, 6, 7, 8]]


# ---------------------------------------------------------------------------------------------- converted
@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """Prefill programs (N = 64, ctx 128, KV as state) per (preset, variant), converted once when first asked for."""
    folder = tmp_path_factory.mktemp("prefill")
    cache = {}

    def get(preset, variant, kv_mode="state"):
        key = (preset, variant, kv_mode)
        if key not in cache:
            model = _model(preset)
            path = folder / f"{preset}-{variant}-{kv_mode}.mlpackage"
            convert_step(PrefillStep(model, CTX, variant, kv_mode, N).eval()).save(str(path))
            cache[key] = (read_program(path), geometry_of(model.config), model.config)
        return cache[key]

    return get


def _max_rank(program) -> int:
    return max(len(t.shape) for op in program.ops for t in (*op.outputs, *(r.tensor for r in op.inputs)))


@pytest.mark.conversion
@pytest.mark.parametrize("preset", representatives(PRESETS, ("exaone-4.0-1.2b", "gemma-3-1b", "phi-3-mini-4k")))
def test_qfold_prefill_copies_no_kv_and_stays_at_rank_4(programs, preset):
    rkv, g, _ = programs(preset, "repeat_kv")
    qf, _, _ = programs(preset, "qfold")
    assert [t for t in qf.tiles() if t.tile_kind == "kv_replication"] == []
    assert _max_rank(qf) <= 4
    kv_tiles = [t for t in rkv.tiles() if t.tile_kind == "kv_replication"]
    if g.group_size == 1:  # MHA: nothing to replicate in either variant
        assert kv_tiles == [] and qf.tiles() == []
        return
    assert len(kv_tiles) == 2 * g.num_layers
    assert {t.outputs[0].nbytes for t in kv_tiles} == {g.num_q_heads * CTX * g.head_dim * 2}
    # the one tile Q-fold keeps lays the [1,1,N,S] mask out for the merged rows, once per call
    assert [t.outputs[0].shape for t in qf.tiles()] == [(1, 1, g.group_size * N, CTX)]
    assert all(t.tile_kind == "other" for t in qf.tiles())
    for program in (rkv, qf):  # the cache is written N slots at a time
        updates = [r.tensor.shape for op in program.ops if op.type == "slice_update"
                   for r in op.inputs if r.param == "update"]
        assert updates == [(1, g.num_kv_heads, N, g.head_dim)] * (2 * g.num_layers)
        assert {t.name: t.shape for t in program.inputs}["causal_mask"] == (1, 1, N, CTX)


def _expected_matmuls(g, cfg, fused_qkv: bool) -> dict[str, list[int]]:
    """Every matmul/linear of a prefill call of N rows, by category, from the config (a multiply-add = 2)."""
    h, i, d, hq, hkv, v = g.hidden_size, cfg.intermediate_size, g.head_dim, g.num_q_heads, g.num_kv_heads, g.vocab_size
    qkv = [2 * N * h * (hq + 2 * hkv) * d] if fused_qkv else [2 * N * h * hq * d] + [2 * N * h * hkv * d] * 2
    mlp = [2 * N * h * 2 * i, 2 * N * i * h] if fused_qkv else [2 * N * h * i] * 2 + [2 * N * i * h]
    return {
        "projections": sorted([*qkv, 2 * N * hq * d * h] * g.num_layers),
        "ffn": sorted(mlp * g.num_layers),
        "attention_scores": [2 * hq * N * CTX * d] * g.num_layers,  # Q·Kᵀ over the whole static cache
        "attention_values": [2 * hq * N * CTX * d] * g.num_layers,
        "lm_head": [2 * 1 * h * v],  # the last prompt row's logits only
    }


@pytest.mark.conversion
@pytest.mark.parametrize("preset", ["exaone-4.0-1.2b", "gemma-3-1b", "phi-3-mini-4k"])
@pytest.mark.parametrize("variant", ["repeat_kv", "qfold"])
def test_flops_of_every_matmul_from_the_config(programs, preset, variant):
    program, g, cfg = programs(preset, variant)
    acc = count_flops(program, N)
    got: dict[str, list[int]] = {}
    for o in acc.ops:
        if o.type in ("matmul", "linear"):
            (category,) = [c for c in ("projections", "ffn", "attention_scores", "attention_values", "lm_head")
                           if o.get(c)] or ["other"]
            got.setdefault(category, []).append(o.total - (o.other if category != "other" else 0))
    got = {k: sorted(v) for k, v in got.items()}
    assert got == _expected_matmuls(g, cfg, fused_qkv=preset == "phi-3-mini-4k")
    assert acc.per_token().total == round(acc.per_call().total / N)


@pytest.mark.conversion
@pytest.mark.parametrize("kv_mode", ["state", "input"])
def test_call_inputs_are_what_the_converted_function_takes(programs, kv_mode):
    """The interpreter check's inputs (``call_inputs``) match the package's inputs by name, shape and dtype."""
    from analyzer.model.prefill import call_inputs

    program, _, _ = programs("exaone-4.0-1.2b", "qfold", kv_mode)
    step = PrefillStep(_model("exaone-4.0-1.2b"), CTX, "qfold", kv_mode, N)
    values = call_inputs(step, list(range(N)), 0)
    declared = {t.name: (t.shape, t.dtype) for t in program.inputs}
    assert {k: (v.shape, {"int32": "int32", "float16": "fp16"}[str(v.dtype)]) for k, v in values.items()} == declared


@pytest.mark.conversion
def test_kv_as_inputs_prefill(programs):
    """A read-only cache: the mask covers the cache and the new tokens, the new keys/values are outputs, and
    repeat_kv replicates both the cache and the new tokens while Q-fold replicates neither."""
    rkv, g, _ = programs("exaone-4.0-1.2b", "repeat_kv", "input")
    qf, _, _ = programs("exaone-4.0-1.2b", "qfold", "input")
    for program in (rkv, qf):
        assert {t.name: t.shape for t in program.inputs}["causal_mask"] == (1, 1, N, CTX + N)
        assert {t.name: t.shape for t in program.outputs}["new_k"] == (g.num_layers, g.num_kv_heads, N, g.head_dim)
        assert not program.states
    assert len([t for t in rkv.tiles() if t.tile_kind == "kv_replication"]) == 4 * g.num_layers
    assert [t for t in qf.tiles() if t.tile_kind == "kv_replication"] == [] and _max_rank(qf) <= 4
