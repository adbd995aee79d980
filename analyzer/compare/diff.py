"""A/B diff of two analyses: op counts, tiles, bytes per token by category and by layer, FLOPs by category.

:func:`figure_differences` lists every op count, tile and byte figure in which two analyses differ; the
test that regenerates the shipped analyses (tests/test_shipped_regeneration.py) holds a regenerated file to
the committed one with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from analyzer.analysis.accounting import CATEGORIES
from analyzer.analysis.flops import FLOP_CATEGORIES
from analyzer.analysis.record import Analysis
from analyzer.analysis.summary import TileRow

BYTE_KEYS: tuple[str, ...] = (*CATEGORIES, "total", "kv_write_value_semantics")
FLOP_KEYS: tuple[str, ...] = (*FLOP_CATEGORIES, "total")


@dataclass(frozen=True, slots=True)
class Change:
    """A figure in A and in B (ints: ops or bytes)."""

    a: int
    b: int

    @property
    def delta(self) -> int:
        return self.b - self.a


@dataclass(frozen=True, slots=True)
class OpCountChange:
    type: str
    a: int
    b: int

    @property
    def delta(self) -> int:
        return self.b - self.a


@dataclass(frozen=True, slots=True)
class LayerChange:
    layer: int | None  # None: outside any decoder layer
    a: int  # total bytes per token of the layer
    b: int

    @property
    def delta(self) -> int:
        return self.b - self.a


@dataclass(frozen=True, slots=True)
class ABDiff:
    total_ops: Change
    non_const_ops: Change
    op_counts: tuple[OpCountChange, ...]  # every op type, the largest change first
    tiles_a: tuple[TileRow, ...]
    tiles_b: tuple[TileRow, ...]
    tile_output_bytes: Change
    bytes_per_token: dict[str, Change]  # BYTE_KEYS → change (never mutated)
    bytes_by_layer: tuple[LayerChange, ...]
    flops_per_token: dict[str, Change] = field(default_factory=dict)  # FLOP_KEYS → change (per prompt token
    flops_per_call: dict[str, Change] = field(default_factory=dict)  # for a prefill; never mutated)
    # why A or B could not be sized (analyzer.analysis.sizing); None: that side's figures are complete
    unsized_reason_a: str | None = None
    unsized_reason_b: str | None = None

    @property
    def sized_a(self) -> bool:
        return self.unsized_reason_a is None

    @property
    def sized_b(self) -> bool:
        return self.unsized_reason_b is None

    @property
    def unsized_copies(self) -> Change:
        """Copies without a size or a verdict on each side, beside :attr:`tile_count`."""
        return Change(sum(t.unsized for t in self.tiles_a), sum(t.unsized for t in self.tiles_b))

    @property
    def op_count_deltas(self) -> tuple[OpCountChange, ...]:
        """Only the op types whose count changed."""
        return tuple(r for r in self.op_counts if r.delta)

    @property
    def tile_count(self) -> Change:
        return Change(len(self.tiles_a), len(self.tiles_b))

    @property
    def tile_bytes_removed(self) -> int:
        return self.tile_output_bytes.a - self.tile_output_bytes.b


def diff_analyses(a: Analysis, b: Analysis) -> ABDiff:
    ca, cb = a.summary.op_counts, b.summary.op_counts
    types = sorted(set(ca) | set(cb), key=lambda t: (-abs(cb.get(t, 0) - ca.get(t, 0)), t))
    ta, tb = a.bytes_per_token, b.bytes_per_token
    layers_a = {r.layer: r.total for r in a.bytes_by_layer}
    layers_b = {r.layer: r.total for r in b.bytes_by_layer}
    layers = sorted(set(layers_a) | set(layers_b), key=lambda x: (x is None, x or 0))
    return ABDiff(
        total_ops=Change(a.summary.total_ops, b.summary.total_ops),
        non_const_ops=Change(a.summary.non_const_ops, b.summary.non_const_ops),
        op_counts=tuple(OpCountChange(t, ca.get(t, 0), cb.get(t, 0)) for t in types),
        tiles_a=a.summary.tiles,
        tiles_b=b.summary.tiles,
        tile_output_bytes=Change(a.summary.tile_output_bytes, b.summary.tile_output_bytes),
        bytes_per_token={k: Change(ta.get(k), tb.get(k)) for k in BYTE_KEYS},
        bytes_by_layer=tuple(LayerChange(x, layers_a.get(x, 0), layers_b.get(x, 0)) for x in layers),
        flops_per_token=_flop_changes(a.flops.per_token(), b.flops.per_token()),
        flops_per_call=_flop_changes(a.flops.per_call(), b.flops.per_call()),
        unsized_reason_a=a.sizing.unsized_reason,
        unsized_reason_b=b.sizing.unsized_reason,
    )


def _flop_changes(a, b) -> dict[str, Change]:
    return {k: Change(a.get(k), b.get(k)) for k in FLOP_KEYS}


def figure_differences(a: Analysis, b: Analysis) -> tuple[str, ...]:
    """Every op count, tile, byte figure (per token, per layer and category, per op) and compressed weight in
    which ``b`` differs from ``a``, one line each; empty when they agree. Build metadata (timestamps, timings,
    memory, versions) is not compared."""
    out: list[str] = []
    d = diff_analyses(a, b)
    if d.unsized_reason_a != d.unsized_reason_b:
        out.append(f"sizing: {d.unsized_reason_a or 'sized'} → {d.unsized_reason_b or 'sized'}")
    out += [f"op count {r.type}: {r.a} → {r.b}" for r in d.op_count_deltas]
    if d.tiles_a != d.tiles_b:
        changed = [(x, y) for x, y in zip(d.tiles_a, d.tiles_b, strict=False) if x != y]
        out.append(f"tiles: {len(d.tiles_a)} → {len(d.tiles_b)}"
                   + (f"; first differing: {changed[0][0]} → {changed[0][1]}" if changed else ""))
    out += [f"bytes per token {k}: {c.a:,} → {c.b:,}" for k, c in d.bytes_per_token.items() if c.delta]
    out += [f"FLOPs per call {k}: {c.a:,} → {c.b:,}" for k, c in d.flops_per_call.items() if c.delta]
    la, lb = a.bytes_by_layer, b.bytes_by_layer
    if la != lb:
        out += [f"bytes of layer {x.layer}: {x} → {y}" for x, y in zip(la, lb, strict=False) if x != y]
        if len(la) != len(lb):
            out.append(f"layers: {len(la)} → {len(lb)}")
    oa, ob = a.account.ops, b.account.ops
    if oa != ob:
        wrong = [(x, y) for x, y in zip(oa, ob, strict=False) if x != y]
        out.append(f"per-op bytes: {len(wrong)} of {min(len(oa), len(ob))} ops differ"
                   + (f", first {wrong[0][0]} → {wrong[0][1]}" if wrong else ""))
    if a.account.unsized != b.account.unsized or a.account.unruled_op_types != b.account.unruled_op_types:
        out.append("unsized tensors or unruled op types differ")
    if a.compression != b.compression:
        out.append(f"compressed weights: {a.compression.total} → {b.compression.total}")
    return tuple(out)
