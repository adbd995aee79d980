"""The whole-program structural diff on the shipped full-size analyses: per-layer differences checked against op
counts read independently from the files, and the verdict the A/B page shows."""

from __future__ import annotations

import functools
from collections import Counter
from dataclasses import replace

import pytest

from analyzer.analysis.record import load_analysis
from analyzer.compare.structdiff import home_layers, is_const_like, structural_diff
from analyzer.ir.coreml.mil_reader import MilProgram
from analyzer.report.catalog import SHIPPED_DIR

PAIRS = {  # (repeat_kv, qfold) shipped analysis files of the default preset, and their total op counts
    "fp16": ("exaone-4.0-1.2b-repeat_kv-state-ctx4096", "exaone-4.0-1.2b-qfold-state-ctx4096", 4_558, 4_318),
    "top8": ("exaone-4.0-1.2b-repeat_kv-state-ctx4096-top8", "exaone-4.0-1.2b-qfold-state-ctx4096-top8",
             4_569, 4_329),
}
LAYERS = 30
PER_LAYER = {"tile": -2, "expand_dims": -2, "const": -4}
VERDICT = "layers 0–29 differ only in attention: −2 tile, −2 expand_dims, −4 const each"


@functools.cache
def _load(stem: str) -> MilProgram:
    return load_analysis(SHIPPED_DIR / f"{stem}.analysis.json").program


@pytest.fixture(scope="module", params=sorted(PAIRS))
def shipped(request) -> tuple[str, MilProgram, MilProgram]:
    a, b, _, _ = PAIRS[request.param]
    return request.param, _load(a), _load(b)


def test_shipped_pair_differs_by_the_same_ops_in_every_layer(shipped):
    name, pa, pb = shipped
    _, _, total_a, total_b = PAIRS[name]
    # the files themselves: 4,558 → 4,318 (fp16), 60 tile, 60 expand_dims and 120 const fewer, nothing else
    assert (pa.total_ops, pb.total_ops) == (total_a, total_b)
    by_type = Counter(op.type for op in pb.ops)
    by_type.subtract(Counter(op.type for op in pa.ops))
    assert {t: n for t, n in by_type.items() if n} == {"tile": -60, "expand_dims": -60, "const": -120}

    diff = structural_diff(pa, pb)
    assert (diff.total_ops_a, diff.total_ops_b) == (total_a, total_b)
    assert [d.layer for d in diff.layers] == [*range(LAYERS), None]
    for d in diff.layers[:LAYERS]:
        assert dict(d.type_deltas) == PER_LAYER, d.layer
        assert d.in_attention is True
        assert d.ops_b - d.ops_a == -8
        # only in A: the two expand_dims → tile chains, a reshape of K/V and five constants (axes, reps, shape);
        # only in B: the reshape back to [1,32,1,64] and its shape; the score/softmax/output path changes shape
        assert Counter(pa.ops[r.a].type for r in d.rows if r.status == "only_a") == {
            "const": 5, "expand_dims": 2, "tile": 2, "reshape": 1}
        assert Counter(pb.ops[r.b].type for r in d.rows if r.status == "only_b") == {"const": 1, "reshape": 1}
        assert Counter(pa.ops[r.a].type for r in d.rows if r.status == "changed") == {
            "reshape": 1, "matmul": 2, "mul": 1, "add": 1, "softmax": 1}
        tiles = [pa.ops[r.a] for r in d.rows if r.a is not None and pa.ops[r.a].type == "tile"]
        assert [t.tile_kind for t in tiles] == ["kv_replication"] * 2
    outside = diff.layer(None)
    assert outside.identical and outside.type_deltas == ()
    assert diff.type_deltas() == {"tile": -60, "expand_dims": -60, "const": -120}
    assert diff.verdict == f"{VERDICT}; outside the layers: identical"


def test_every_op_is_in_exactly_one_row(shipped):
    _, pa, pb = shipped
    diff = structural_diff(pa, pb)
    rows_a = [r.a for d in diff.layers for r in d.rows if r.a is not None]
    rows_b = [r.b for d in diff.layers for r in d.rows if r.b is not None]
    assert sorted(rows_a) == list(range(pa.total_ops)) and sorted(rows_b) == list(range(pb.total_ops))
    homes_a, homes_b = home_layers(pa), home_layers(pb)
    for d in diff.layers:
        assert d.ops_a == d.matched + d.changed + d.only_a and d.ops_b == d.matched + d.changed + d.only_b
        for r in d.rows:
            assert r.a is None or homes_a[r.a] == d.layer
            assert r.b is None or homes_b[r.b] == d.layer
            assert r.const == is_const_like(pa.ops[r.a] if r.a is not None else pb.ops[r.b])
            if r.a is not None and r.b is not None:  # aligned ops have one type
                assert pa.ops[r.a].type == pb.ops[r.b].type
            if r.status == "matched" and not r.const:
                assert ([(t.shape, t.dtype) for t in pa.ops[r.a].outputs]
                        == [(t.shape, t.dtype) for t in pb.ops[r.b].outputs])


def test_constants_live_in_the_layer_of_their_first_reader(shipped):
    _, pa, _ = shipped
    homes = home_layers(pa)
    consumers = pa.consumers()
    tile = next(op for op in pa.ops if op.type == "tile")
    reps = next(r for r in tile.inputs if r.param == "reps")
    assert pa.ops[reps.producer].layer is None  # the walker cannot place ``x_1_reps_0`` by name
    assert homes[reps.producer] == tile.layer == 0
    for op in pa.ops:
        if op.layer is None and is_const_like(op) and homes[op.index] is not None:
            first = min(c for c in consumers[op.index] if homes[c] is not None)
            assert homes[op.index] == homes[first]


def test_a_program_against_itself_is_identical():
    pa = _load(PAIRS["fp16"][0])
    diff = structural_diff(pa, pa)
    assert all(d.identical for d in diff.layers)
    assert diff.verdict == "layers 0–29: identical; outside the layers: identical"


def test_a_difference_outside_attention_is_called_so():
    """Swap one MLP activation of layer 3 (silu → gelu): that layer differs, not only in attention."""
    pa = _load(PAIRS["fp16"][1])
    silu = next(op for op in pa.ops if op.type == "silu" and op.layer == 3)
    pb = replace(pa, ops=tuple(replace(op, type="gelu") if op.index == silu.index else op for op in pa.ops))
    diff = structural_diff(pa, pb)
    d3 = diff.layer(3)
    assert dict(d3.type_deltas) == {"gelu": 1, "silu": -1}
    assert (d3.only_a, d3.only_b, d3.in_attention) == (1, 1, False)
    assert d3.verdict == "layer 3 differs: +1 gelu, −1 silu"
    assert diff.verdict == ("layers 0–2: identical; layer 3 differs: +1 gelu, −1 silu; layers 4–29: identical; "
                            "outside the layers: identical")
