"""Whole-program structural diff of two MIL programs, layer by layer: which ops match, which exist on one side.

Works from any two :class:`~analyzer.ir.coreml.mil_reader.MilProgram` objects (two builds, a package against its folded
copy, two converters' graphs of one model); nothing here knows how a program was made.

**Home layer.** Each op belongs to one layer: its ``OpRecord.layer``, except that a constant the walker
could not place by name (a shape, an axis, a ``reps`` vector: ``var_358``) lives in the layer of its first
reader, and ``None`` ("outside": embedding, RoPE tables, mask, final norm, lm_head) is what is left. So the
three constants that feed a ``repeat_kv`` tile chain are counted in the layer of that chain::

    const axes=[2] ─► expand_dims ─► tile(reps=const [1,1,4,1,1]) ─► reshape(shape=const [1,32,4096,64])

**Alignment.** Within a layer the compute ops of A and B are aligned in program order (which is topological)
with :class:`difflib.SequenceMatcher`, twice: on the full signature (type, output shapes and dtypes, tile
kind) → ``matched``; then, inside each stretch that did not match, on the op type alone → ``changed`` (the
same op computing other shapes, e.g. the Q-fold's ``[1,8,4,4096]`` score matmul against repeat_kv's
``[1,32,1,4096]``). The rest is ``only_a`` / ``only_b``. Constants (``const``, ``constexpr_*``) are badges
of the op that reads them first: they match when their reader is aligned and the counterpart reads a
constant of the same signature through the same parameter.

Shipped EXAONE 4.0 1.2B fp16 pair, layer 0 (repeat_kv → Q-fold)::

    A  read_state ─► expand_dims ─► tile ─► reshape ─► matmul [1,32,1,4096]      (K; V the same)
    B  read_state ──────────────────────────────────► matmul [1,8,4,4096]  ◄─ reshape q [1,8,4,64]
    only in A: 2 expand_dims, 2 tile, 1 reshape, 5 const; only in B: 1 reshape (the output's), 1 const;
    changed: 6 ops (a reshape, both matmuls, the scale, the mask add, the softmax: other shapes)
    net: −2 tile, −2 expand_dims, −4 const in every layer; 4,558 → 4,318 ops in all

The verdict says where the differing ops sit: *attention* is the part of a layer that touches the KV
cache (ops that read, copy or write it), everything upstream of those ops in the layer, and everything
downstream of them up to the first op that reads weights (the output projection).
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from analyzer.analysis.accounting import ByteAccount, account
from analyzer.ir.coreml.mil_reader import MilProgram, OpRecord

Status = Literal["matched", "changed", "only_a", "only_b"]
STATUSES: tuple[Status, ...] = ("matched", "changed", "only_a", "only_b")
OUTSIDE_TEXT = "outside the layers"
MINUS = "\u2212"  # the verdict's minus sign, as typeset: "−2 tile"
EN_DASH = "\u2013"  # layer ranges: "layers 0–29"


def is_const_like(op: OpRecord) -> bool:
    """Constant data: ``const`` ops and the ``constexpr_*`` ops that decompress weights at load time."""
    return op.kind == "const" or op.type.startswith("constexpr_")


def home_layers(program: MilProgram) -> tuple[int | None, ...]:
    """Op index → the layer the op belongs to: its own layer, or, for a constant the walker left outside,
    the layer of its first reader (constants feed only later ops, so one pass in program order suffices
    once the readers' layers are known)."""
    homes: list[int | None] = [op.layer for op in program.ops]
    consumers = program.consumers()
    for op in reversed(program.ops):  # a constexpr reader of a const is itself re-homed first
        if op.layer is None and is_const_like(op):
            placed = [homes[c] for c in consumers[op.index] if homes[c] is not None]
            homes[op.index] = placed[0] if placed else None
    return tuple(homes)


def layer_order(layers: Iterable[int | None]) -> list[int | None]:
    """Decoder layers ascending, then outside (``None``)."""
    return sorted(set(layers), key=lambda x: (x is None, x if x is not None else 0))


def layer_text(layer: int | None) -> str:
    return OUTSIDE_TEXT if layer is None else f"layer {layer}"


# ------------------------------------------------------------------------------------------------- records
@dataclass(frozen=True, slots=True)
class AlignedOp:
    """One row of a layer's alignment: an op of A, of B, or one of each."""

    a: int | None  # op index in A
    b: int | None  # op index in B
    status: Status
    const: bool  # a constant (drawn as a badge on its reader in the graph view)


@dataclass(frozen=True, slots=True)
class LayerDiff:
    """The alignment of one layer and what differs."""

    layer: int | None
    rows: tuple[AlignedOp, ...]
    ops_a: int
    ops_b: int
    type_deltas: tuple[tuple[str, int], ...]  # (op type, count in B − count in A), non-zero, in verdict order
    in_attention: bool | None  # every differing op is in attention; None when nothing differs

    def count(self, status: Status) -> int:
        return sum(1 for r in self.rows if r.status == status)

    @property
    def matched(self) -> int:
        return self.count("matched")

    @property
    def changed(self) -> int:
        return self.count("changed")

    @property
    def only_a(self) -> int:
        return self.count("only_a")

    @property
    def only_b(self) -> int:
        return self.count("only_b")

    @property
    def identical(self) -> bool:
        return all(r.status == "matched" for r in self.rows)

    def status_of(self, side: Literal["a", "b"]) -> dict[int, Status]:
        """Op index on one side → its status."""
        out: dict[int, Status] = {}
        for r in self.rows:
            index = r.a if side == "a" else r.b
            if index is not None:
                out[index] = r.status
        return out

    @property
    def change_text(self) -> str:
        """``differ only in attention: −2 tile, −2 expand_dims, −4 const``, ``only in B: 142 ops`` or
        ``identical`` (no subject)."""
        if self.identical:
            return "identical"
        if not (self.ops_a and self.ops_b):  # a layer one program does not have
            return f"only in {'A' if self.ops_a else 'B'}: {self.ops_a or self.ops_b:,} ops"
        where = " only in attention" if self.in_attention else ""
        if self.type_deltas:
            what = ", ".join(_signed(d) + f" {t}" for t, d in self.type_deltas)
        else:
            n = self.changed + self.only_a
            what = f"same op counts, {n} op{'s' * (n != 1)} with other shapes or wiring"
        return f"differ{where}: {what}"

    @property
    def verdict(self) -> str:
        """One sentence for this layer: ``layer 3 differs only in attention: −2 tile, …``."""
        return _sentence(layer_text(self.layer), self.change_text, plural=self.layer is None)


@dataclass(frozen=True, slots=True)
class StructuralDiff:
    """Every layer's alignment, decoder layers first, then outside."""

    layers: tuple[LayerDiff, ...]
    total_ops_a: int
    total_ops_b: int

    def layer(self, layer: int | None) -> LayerDiff:
        for d in self.layers:
            if d.layer == layer:
                return d
        raise KeyError(layer)

    def type_deltas(self) -> dict[str, int]:
        """Op type → count in B − count in A over the whole program (non-zero only)."""
        total: Counter[str] = Counter()
        for d in self.layers:
            for t, n in d.type_deltas:
                total[t] += n
        return {t: n for t, n in _verdict_order(total.items())}

    @property
    def verdict(self) -> str:
        """``layers 0–29 differ only in attention: −2 tile, −2 expand_dims, −4 const each; outside the layers
        identical``: consecutive layers with the same change are grouped."""
        groups: list[list[LayerDiff]] = []
        for d in (x for x in self.layers if x.layer is not None):
            if groups and groups[-1][-1].change_text == d.change_text and groups[-1][-1].layer == d.layer - 1:
                groups[-1].append(d)
            else:
                groups.append([d])
        parts = []
        for g in groups:
            if len(g) == 1:
                parts.append(g[0].verdict)
            else:
                text = g[0].change_text
                parts.append(_sentence(f"layers {g[0].layer}{EN_DASH}{g[-1].layer}", text, plural=True)
                             + ("" if text == "identical" else " each"))
        parts += [d.verdict for d in self.layers if d.layer is None]
        return "; ".join(parts) if parts else "no ops on either side"

    def rows(self) -> list[dict[str, object]]:
        """One dict per layer: counts and the verdict (the table and its CSV)."""
        return [{"layer": d.layer, "ops_a": d.ops_a, "ops_b": d.ops_b, "delta_ops": d.ops_b - d.ops_a,
                 "matched": d.matched, "changed": d.changed, "only_a": d.only_a, "only_b": d.only_b,
                 "type_deltas": ", ".join(_signed(n) + f" {t}" for t, n in d.type_deltas), "verdict": d.verdict}
                for d in self.layers]


def _sentence(subject: str, change_text: str, *, plural: bool) -> str:
    if change_text == "identical":
        return f"{subject}: identical"
    if change_text.startswith("only in"):
        return f"{subject} {change_text}"
    return f"{subject} {change_text if plural else change_text.replace('differ', 'differs', 1)}"


def _signed(n: int) -> str:
    return f"{MINUS}{-n:,}" if n < 0 else f"+{n:,}"


def _verdict_order(items: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
    """tile first (the copies this tool is about), then by |Δ| and name, const last."""
    return sorted(((t, n) for t, n in items if n),
                  key=lambda tn: (tn[0] != "tile", tn[0] == "const", -abs(tn[1]), tn[0]))


# ------------------------------------------------------------------------------------------------- attention
def attention_ops(program: MilProgram, homes: Sequence[int | None], acct: ByteAccount | None = None) -> frozenset[int]:
    """The ops of each layer's attention: the KV roots (ops that read, copy or write the cache), their
    ancestors inside the layer, their descendants inside the layer up to and including the first op that
    reads weights (the output projection), and the constants those ops read first."""
    acct = acct or account(program)
    ops = program.ops
    consumers = program.consumers()
    roots = [op.index for op in ops if not is_const_like(op) and (
        op.kind in ("read_state", "write_state") or op.tile_kind == "kv_replication"
        or any(getattr(acct.ops[op.index], c) for c in ("kv_read", "kv_write", "replication",
                                                           "kv_write_value_semantics")))]
    found: set[int] = set(roots)
    stack = list(roots)
    while stack:  # ancestors in the same layer
        op = ops[stack.pop()]
        for ref in op.inputs:
            p = ref.producer
            if p is not None and p not in found and not is_const_like(ops[p]) and homes[p] == homes[op.index]:
                found.add(p)
                stack.append(p)
    stack = list(roots)
    while stack:  # descendants in the same layer, up to the first weight reader
        i = stack.pop()
        if i not in roots and acct.ops[i].weights:
            continue
        for c in consumers[i]:
            if c not in found and homes[c] == homes[i]:
                found.add(c)
                stack.append(c)
    owners = _owners(program, homes)
    found |= {i for i, owner in owners.items() if owner in found}
    return frozenset(found)


def _owners(program: MilProgram, homes: Sequence[int | None]) -> dict[int, int | None]:
    """Constant op index → the compute op that reads it first (through constexpr decompression), preferring
    a reader in the constant's own layer; None for a constant nothing reads."""
    consumers = program.consumers()
    out: dict[int, int | None] = {}
    for op in reversed(program.ops):
        if not is_const_like(op):
            continue
        readers = []
        for c in consumers[op.index]:
            readers.append(out.get(c) if is_const_like(program.ops[c]) else c)
        readers = [r for r in readers if r is not None]
        same = [r for r in readers if homes[r] == homes[op.index]]
        out[op.index] = (same or readers or [None])[0]
    return out


# ------------------------------------------------------------------------------------------------- alignment
def _signature(op: OpRecord) -> tuple:
    return (op.type, tuple((t.shape, t.dtype) for t in op.outputs), op.tile_kind)


def _align(seq_a: Sequence[OpRecord], seq_b: Sequence[OpRecord]) -> list[AlignedOp]:
    """Two-pass difflib alignment of compute ops (see the module docstring)."""
    rows: list[AlignedOp] = []
    full = difflib.SequenceMatcher(None, [_signature(o) for o in seq_a], [_signature(o) for o in seq_b],
                                   autojunk=False)
    for tag, i1, i2, j1, j2 in full.get_opcodes():
        if tag == "equal":
            rows += [AlignedOp(seq_a[i].index, seq_b[j].index, "matched", False)
                     for i, j in zip(range(i1, i2), range(j1, j2), strict=True)]
            continue
        part_a, part_b = seq_a[i1:i2], seq_b[j1:j2]
        by_type = difflib.SequenceMatcher(None, [o.type for o in part_a], [o.type for o in part_b], autojunk=False)
        for tag2, k1, k2, m1, m2 in by_type.get_opcodes():
            if tag2 == "equal":
                rows += [AlignedOp(part_a[k].index, part_b[m].index, "changed", False)
                         for k, m in zip(range(k1, k2), range(m1, m2), strict=True)]
            else:
                rows += [AlignedOp(o.index, None, "only_a", False) for o in part_a[k1:k2]]
                rows += [AlignedOp(None, o.index, "only_b", False) for o in part_b[m1:m2]]
    return rows


def _const_inputs(program: MilProgram, op_index: int, owned: dict[int, list[int]]) -> list[tuple[str, int]]:
    """(parameter, const op index) of the constants ``op_index`` owns, in input order."""
    mine = set(owned.get(op_index, ()))
    out = []
    for ref in program.ops[op_index].inputs:
        if ref.producer in mine:
            out.append((ref.param, ref.producer))
            mine.discard(ref.producer)
    # constants owned through a constexpr (LUT, indices, scales) follow their constexpr
    out += [("", c) for c in sorted(mine)]
    return out


def _align_layer(layer: int | None, pa: MilProgram, ha: Sequence[int | None], oa: dict[int, int | None],
                 pb: MilProgram, hb: Sequence[int | None], ob: dict[int, int | None],
                 att_a: frozenset[int], att_b: frozenset[int]) -> LayerDiff:
    in_a = [op for op in pa.ops if ha[op.index] == layer]
    in_b = [op for op in pb.ops if hb[op.index] == layer]
    body = _align([o for o in in_a if not is_const_like(o)], [o for o in in_b if not is_const_like(o)])
    owned_a: dict[int, list[int]] = {}
    owned_b: dict[int, list[int]] = {}
    for owners, ops, owned in ((oa, in_a, owned_a), (ob, in_b, owned_b)):
        for op in ops:
            if is_const_like(op):
                owned.setdefault(owners[op.index], []).append(op.index)  # type: ignore[arg-type]

    rows: list[AlignedOp] = []
    for r in body:
        consts_a = _const_inputs(pa, r.a, owned_a) if r.a is not None else []
        consts_b = _const_inputs(pb, r.b, owned_b) if r.b is not None else []
        rows += _pair_consts(pa, consts_a, pb, consts_b)
        rows.append(r)
    # constants nobody in this layer reads first (dead, or read first from another layer)
    placed_a = {r.a for r in rows if r.a is not None}
    placed_b = {r.b for r in rows if r.b is not None}
    rest_a = [o for o in in_a if is_const_like(o) and o.index not in placed_a]
    rest_b = [o for o in in_b if is_const_like(o) and o.index not in placed_b]
    rows += [AlignedOp(r.a, r.b, r.status, True) for r in _align(rest_a, rest_b)]

    deltas = Counter(o.type for o in in_b)
    deltas.subtract(Counter(o.type for o in in_a))
    differing = [(r.a, r.b) for r in rows if r.status != "matched"]
    in_attention = None
    if differing:
        in_attention = all((a is None or a in att_a) and (b is None or b in att_b) for a, b in differing)
        # a layer with no KV at all has no attention to speak of
        in_attention = in_attention and bool(att_a or att_b)
    return LayerDiff(layer, tuple(rows), len(in_a), len(in_b), tuple(_verdict_order(deltas.items())), in_attention)


def _pair_consts(pa: MilProgram, consts_a: list[tuple[str, int]], pb: MilProgram,
                 consts_b: list[tuple[str, int]]) -> list[AlignedOp]:
    """Constants of an aligned pair of readers: same parameter and signature → matched; same parameter,
    other signature → changed; the rest one-sided."""
    rows: list[AlignedOp] = []
    left_b = list(consts_b)
    for param, a in consts_a:
        exact = next((x for x in left_b if x[0] == param and _signature(pb.ops[x[1]]) == _signature(pa.ops[a])), None)
        same_param = exact or next((x for x in left_b if x[0] == param and pb.ops[x[1]].type == pa.ops[a].type), None)
        if same_param is None:
            rows.append(AlignedOp(a, None, "only_a", True))
            continue
        left_b.remove(same_param)
        rows.append(AlignedOp(a, same_param[1], "matched" if exact else "changed", True))
    rows += [AlignedOp(None, b, "only_b", True) for _, b in left_b]
    return rows


def structural_diff(program_a: MilProgram, program_b: MilProgram) -> StructuralDiff:
    """Align every layer of A with the same layer of B (layers present on one side only are all one-sided)."""
    ha, hb = home_layers(program_a), home_layers(program_b)
    oa, ob = _owners(program_a, ha), _owners(program_b, hb)
    att_a, att_b = attention_ops(program_a, ha), attention_ops(program_b, hb)
    layers = tuple(_align_layer(layer, program_a, ha, oa, program_b, hb, ob, att_a, att_b)
                   for layer in layer_order([*ha, *hb]))
    return StructuralDiff(layers, program_a.total_ops, program_b.total_ops)
