"""The one classifier of KV replication (analyzer.ir.replication) on backend-neutral facts: no MIL here.

Each case states a copy the way a reader would (source shape, the steps to each operand, the consumer kind) and
checks the verdict and its reason. Shapes: Hkv = 2 KV heads, G = 4, Hq = 8, S = 6 slots, D = 4 head dim.
"""

from __future__ import annotations

import pytest

from analyzer.ir.replication import (
    MATMUL_LHS,
    MATMUL_RHS,
    OTHER,
    SDPA_KV,
    SDPA_OTHER,
    SHRUNK_SIZE,
    WEIGHT_MUL,
    CopyFacts,
    CopyRead,
    SourceCandidate,
    ViewStep,
    classify_copy,
    evaluate_steps,
    shrunk_chain,
)

HKV, G, S, D = 2, 4, 6, 4
HQ = HKV * G


def repeat_kv_facts(kind: str = MATMUL_RHS, k_transposed: bool = False) -> CopyFacts:
    """expand_dims → tile → reshape (h // G), optionally read as Kᵀ through a trailing transpose."""
    expand = ViewStep("reshape", (1, HKV, 1, S, D))
    tile = ViewStep("tile", (1, HKV, G, S, D), reps=(1, 1, G, 1, 1))
    after = [ViewStep("reshape", (1, HQ, S, D))]
    if k_transposed:
        after.append(ViewStep("transpose", (1, HQ, D, S), perm=(0, 1, 3, 2)))
    sources = (SourceCandidate((1, HKV, 1, S, D), (tile,), 0), SourceCandidate((1, HKV, S, D), (expand, tile), 1))
    return CopyFacts("k_rep", (1, HKV, 1, S, D), (1, HKV, G, S, D), sources,
                     (CopyRead("matmul", "scores", kind, tuple(after), "y"),))


def test_repeat_kv_is_replication_with_its_head_mapping():
    v = classify_copy(repeat_kv_facts())
    assert v.is_kv and (v.kv_heads, v.group, v.query_heads) == (HKV, G, HQ)
    assert v.reads[0].kv_map == (0, 0, 0, 0, 1, 1, 1, 1) and not v.reads[0].swapped
    assert v.source_depth == 1 and v.source_view == (1, HKV, S, D)  # the cache itself, before expand_dims
    assert v.copied_axes == (2,)


def test_k_read_transposed_is_replication_of_the_same_source():
    v = classify_copy(repeat_kv_facts(k_transposed=True))
    assert v.is_kv and v.reads[0].swapped and v.source_view == (1, HKV, S, D)


@pytest.mark.parametrize("kind", [MATMUL_RHS, MATMUL_LHS, SDPA_KV, WEIGHT_MUL])
def test_every_attention_read_counts(kind):
    assert classify_copy(repeat_kv_facts(kind)).is_kv


@pytest.mark.parametrize("kind, reason", [(OTHER, "feeds matmul 'scores', not an attention matmul"),
                                          (SDPA_OTHER, "not its key or value")])
def test_other_reads_are_not_replication(kind, reason):
    v = classify_copy(repeat_kv_facts(kind))
    assert not v.is_kv and reason in v.reason


def test_a_tile_along_the_sequence_axis_is_not_replication():
    """CoreML-LLM's masked cache write: ``k.expand_as(K_cache)`` tiles the new row [1, Hkv, 1, D] over S slots."""
    tile = ViewStep("tile", (1, HKV, S, D), reps=(1, 1, S, 1))
    facts = CopyFacts("k_bcast", (1, HKV, 1, D), (1, HKV, S, D), (SourceCandidate((1, HKV, 1, D), (tile,)),),
                      (CopyRead("matmul", "scores", MATMUL_RHS, (), "y"),))
    v = classify_copy(facts)
    assert not v.is_kv and "not a whole number of heads" in v.reason and v.copied_axes == (2,)


def test_a_mask_tiled_over_heads_feeding_add_is_not_replication():
    tile = ViewStep("tile", (1, HQ, 1, S), reps=(1, HQ, 1, 1))
    facts = CopyFacts("mask8", (1, 1, 1, S), (1, HQ, 1, S), (SourceCandidate((1, 1, 1, S), (tile,)),),
                      (CopyRead("add", "scores_masked", OTHER, (), "y"),))
    v = classify_copy(facts)
    assert not v.is_kv and "feeds add" in v.reason


def test_mixed_axes_are_refused_with_the_reason():
    tile = ViewStep("tile", (1, HKV * G, S, D), reps=(1, G, 1, 1))
    mix = ViewStep("transpose", (1, HQ, D, S), perm=(0, 1, 3, 2))
    scramble = ViewStep("reshape", (1, HQ, S, D))  # Kᵀ's memory read back as [S, D]: slots and dims mixed
    facts = CopyFacts("k", (1, HKV, S, D), (1, HQ, S, D), (SourceCandidate((1, HKV, S, D), (tile,)),),
                      (CopyRead("matmul", "scores", MATMUL_RHS, (mix, scramble), "y"),))
    assert "mixed" in classify_copy(facts).reason


def test_index_evaluation_is_positions_not_values():
    a = evaluate_steps((1, 2, 3), (ViewStep("tile", (1, 4, 3), reps=(1, 2, 1)),))
    assert a.tolist() == [[[0, 1, 2], [3, 4, 5], [0, 1, 2], [3, 4, 5]]]


def _llama_8b_chain(ctx: int, merged: bool = False) -> CopyFacts:
    """Llama 3.1 8B's repeat_kv at ``ctx`` (8 KV heads, G = 4, D = 128); ``merged``: the copy is read as
    [1, 32, ctx·128], slots and head dim merged (no head layout a matmul reads)."""
    tile = ViewStep("tile", (1, 8, 4, ctx, 128), reps=(1, 1, 4, 1, 1))
    after = ViewStep("reshape", (1, 32, ctx * 128) if merged else (1, 32, ctx, 128))
    return CopyFacts("x_1", (1, 8, 1, ctx, 128), (1, 8, 4, ctx, 128),
                     (SourceCandidate((1, 8, 1, ctx, 128), (tile,)),),
                     (CopyRead("matmul", "scores", MATMUL_RHS, (after,), "y"),))


def test_a_copy_too_large_to_evaluate_is_judged_with_its_slots_shrunk_so_no_verdict_depends_on_ctx():
    """At ctx 32768 the copy is 2^27 index elements, past MAX_INDEX_ELEMENTS (the 8B sweep of issue 23 found its
    64 tiles called "other" there and "kv_replication" at ctx ≤ 16384): the slots axis is evaluated at
    SHRUNK_SIZE, and the verdict, head map and full-size view are those of ctx 8192, evaluated in full."""
    small, large = classify_copy(_llama_8b_chain(8192)), classify_copy(_llama_8b_chain(65536))
    assert small.is_kv and large.is_kv, large.reason
    assert large.reads == small.reads and large.source_view == (1, 8, 65536, 128)
    assert shrunk_chain((1, 8, 1, 65536, 128), _llama_8b_chain(65536).reads[0].steps)[0] == (1, 8, 1, SHRUNK_SIZE, 128)
    merged = classify_copy(_llama_8b_chain(65536, merged=True))  # shrinking cannot make an inconsistent chain pass
    assert not merged.is_kv and "too large to evaluate" in merged.reason
