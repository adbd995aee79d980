"""The write-up's graph figures, on the structure config (30 layers, 32/8 heads, head_dim 64, ctx 4096,
KV as state): same tiles and tile bytes as the full-size EXAONE 4.0 1.2B."""

import pytest

from analyzer.analysis.record import load_analysis
from analyzer.compare.diff import diff_analyses

pytestmark = pytest.mark.conversion

TILE_BYTES = 8 * 4 * 4096 * 64 * 2  # [1, 8, 4, 4096, 64] fp16
LAYERS = 30


@pytest.fixture(scope="module")
def docs(structure_builds):
    return {v: load_analysis(p) for v, p in structure_builds.items()}


def test_repeat_kv_has_sixty_kv_replication_tiles_of_16_mib(docs):
    analysis = docs["repeat_kv"]
    tiles = analysis.summary.tiles
    assert len(tiles) == 2 * LAYERS == 60
    assert {t.kind for t in tiles} == {"kv_replication"}
    assert {t.output_shape for t in tiles} == {(1, 8, 4, 4096, 64)}
    assert {t.input_shape for t in tiles} == {(1, 8, 1, 4096, 64)}
    assert {t.dtype for t in tiles} == {"fp16"}
    assert all(t.output_bytes == TILE_BYTES == 16_777_216 for t in tiles)
    assert analysis.summary.tile_output_bytes == 1_006_632_960
    # every layer owns one K tile and one V tile
    assert sorted(t.layer for t in tiles) == sorted(list(range(LAYERS)) * 2)


def test_qfold_has_no_tile_and_both_keep_sixty_state_updates(docs):
    assert docs["qfold"].summary.tile_count == 0
    for variant in ("repeat_kv", "qfold"):
        counts = docs[variant].summary.op_counts
        assert counts["slice_update"] == 60
        assert counts["write_state"] == 60
        assert counts["read_state"] == 120


def test_qfold_removes_exactly_the_replication_ops(docs):
    d = diff_analyses(docs["repeat_kv"], docs["qfold"])
    assert {r.type: r.delta for r in d.op_count_deltas} == {"tile": -60, "expand_dims": -60, "const": -120}


def test_bytes_per_token_differ_by_exactly_the_replication(docs):
    a = docs["repeat_kv"].bytes_per_token
    b = docs["qfold"].bytes_per_token
    assert a.replication == 2 * 1_006_632_960 == 2_013_265_920  # written + read again: 1,920 MiB
    assert b.replication == 0
    assert a.total - b.total == a.replication
    for category in ("weights", "kv_read", "kv_write", "activations", "kv_write_value_semantics"):
        assert a.get(category) == b.get(category), category
    assert a.kv_read == LAYERS * 2 * 8 * 4096 * 64 * 2 == 251_658_240
    assert a.kv_write == LAYERS * 2 * 8 * 64 * 2 == 61_440
    assert a.kv_write_value_semantics == LAYERS * 2 * 8 * 4096 * 64 * 2


def test_per_layer_bytes_add_up_and_carry_the_tiles(docs):
    analysis = docs["repeat_kv"]
    rows = analysis.bytes_by_layer
    assert sum(r.total for r in rows) == analysis.bytes_per_token.total
    per_layer = {r.layer: r for r in rows}
    for layer in range(LAYERS):
        assert per_layer[layer].replication == 2 * 2 * TILE_BYTES
        assert per_layer[layer].kv_read == 2 * 8 * 4096 * 64 * 2


def test_equivalence_is_stored_fp16_bit_identical_fp32_same_tokens(docs):
    eq = docs["qfold"].build.equivalence
    pairs = {p.dtype: p for p in eq.pairs}
    assert pairs["fp16"].bit_identical and pairs["fp16"].max_abs_diff == 0.0
    assert pairs["fp32"].greedy_agree_steps == pairs["fp32"].steps == 8
    assert pairs["fp32"].max_abs_diff < 1e-3
