"""Why two analyses differ: every byte-category and op-count difference split by op kind, each part with its cause
read off the two graphs.

Every byte is charged to exactly one op (``accounting``), so a category's difference is exactly the sum of its
per-kind differences (an op's kind is its MIL op, or what a Core AI op moves data like: ``OpRecord.kind``). For
each part, the ops of that kind that carry bytes of that category are described on both sides from the graph
itself (:class:`OpGroup`) — how many there are and of which op types, the element types of the tensors they write,
the constants they read (weights: type and shape), and what made the tensors they read (the producing op's kind,
through views; the KV cache; a program input) — and the cause is what differs between the two descriptions, with
an op of each side named as an example. Ops that decompress weights on every call (Core AI's ``lut_to_dense``,
``blockwise_shift_scale``, …: ``analyzer.ir.coreai.dialect.PER_CALL_DECOMPRESSION``, what those ops do) are said to,
beside the other side's load-time ``constexpr_*`` ops; and where a compressed weight's bytes differ, how each side
stores each compressed part (scheme, granularity, stored dtypes: ``compression_report``) is compared and named.
Nothing is looked up in a table of known converter habits, so a diff of any two programs (a Core ML build against
a Core AI build, two converters' packages, a package and its fold) says what its own graphs show:

    explain(a, b) → (Reason("activations", "transpose", 0, 5_013_504,
                            "B has 10 transpose ops here, A 2; B's read constants fp16 [256,64] (8), A's none; …"),
                     …)
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from analyzer.analysis.accounting import ATTRIBUTE_PARAMS, CATEGORIES
from analyzer.analysis.compression import compression_report
from analyzer.analysis.record import Analysis
from analyzer.ir.coreai.dialect import PER_CALL_DECOMPRESSION
from analyzer.ir.mil_records import VIEW_OPS, InputRef, MilProgram, OpRecord

# How many distinct values a description lists before it says "…".
_LISTED = 3


@dataclass(frozen=True, slots=True)
class Reason:
    """One part of a difference: ``aspect`` a byte category (or ``ops``), the op ``kind``, A's and B's figure
    (bytes, or op count for ``ops``), and why (what the two graphs' ops of that kind differ in)."""

    aspect: str
    kind: str
    a: int
    b: int
    why: str

    @property
    def delta(self) -> int:
        return self.b - self.a

    def to_json(self) -> dict[str, Any]:
        return {"aspect": self.aspect, "kind": self.kind, "a": self.a, "b": self.b, "delta": self.delta,
                "why": self.why}


@dataclass(frozen=True, slots=True)
class OpGroup:
    """The ops of one kind that carry bytes of one category, on one side, as the graph shows them. Each field is a
    sorted tuple of ``(value, ops)`` pairs."""

    ops: int
    types: tuple[tuple[str, int], ...]  # op types
    writes: tuple[tuple[str, int], ...]  # element types of their outputs
    constants: tuple[tuple[str, int], ...]  # the constants (weights) they read: "fp16 [256,64]"
    reads: tuple[tuple[str, int], ...]  # what made the tensors they read: an op kind, "the KV cache", an input
    example: str  # one op's name

    @classmethod
    def of(cls, program: MilProgram, ops: list[OpRecord]) -> OpGroup:
        types, writes, constants, reads = Counter(), Counter(), Counter(), Counter()
        for op in ops:
            types[op.type] += 1
            writes.update({t.dtype for t in op.outputs})
            consts, sources = set(), set()
            for ref in op.inputs:
                source = _source(program, ref)
                if source is None:
                    continue
                if source.startswith("constant"):
                    consts.add(source.removeprefix("constant "))
                else:
                    sources.add(source)
            constants.update(consts)
            reads.update(sources)
        return cls(len(ops), _sorted(types), _sorted(writes), _sorted(constants), _sorted(reads),
                   ops[0].name if ops else "")


def _sorted(c: Counter) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def _source(program: MilProgram, ref: InputRef) -> str | None:
    """What an op input is, looking back through views: ``constant fp16 [256,64]`` (a weight: a const or a
    decompressed ``constexpr_*``), the kind of op that made it (``the KV cache`` for a state read), or a program
    input by name; None for what moves no data (an attribute such as a shape or a perm, a scalar, a zero
    constant: the byte rules' conventions)."""
    if ref.param in ATTRIBUTE_PARAMS or len(ref.tensor.shape) == 0:
        return None
    for _ in range(64):  # a chain of views is short; the bound only guards against a malformed record
        if ref.producer is None:
            return f"constant {ref.tensor.dtype} {ref.tensor.shape_text}" if ref.is_const else \
                f"input {ref.tensor.name!r}"
        producer = program.ops[ref.producer]
        if producer.kind == "const" or producer.type.startswith("constexpr_"):
            t = producer.outputs[0] if producer.outputs else ref.tensor
            return None if producer.const_zero else f"constant {t.dtype} {t.shape_text}"
        if producer.kind not in VIEW_OPS:
            return "the KV cache" if producer.kind == "read_state" else producer.kind
        inner = next((r for r in producer.inputs if r.param == "x"), None)
        if inner is None:
            return producer.kind
        ref = inner
    return None


def _listed(pairs: tuple[tuple[str, int], ...]) -> str:
    shown = ", ".join(f"{v} ({n})" if n > 1 else v for v, n in pairs[:_LISTED])
    return shown + (", …" if len(pairs) > _LISTED else "") if pairs else "none"


def _only(x: tuple[tuple[str, int], ...], y: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """What ``x`` counts more of than ``y`` (ops of one side that the other side's ops do not match)."""
    return _sorted(Counter(dict(x)) - Counter(dict(y)))


def _cause(kind: str, ga: OpGroup, gb: OpGroup) -> str:
    """What the two groups differ in, A then B, from the graphs; the example ops last."""
    if not ga.ops or not gb.ops:
        side, g, other = ("A", ga, "B") if ga.ops else ("B", gb, "A")
        parts = [f"only {side} has {kind} ops here: {g.ops} ({_listed(g.types)}), writing {_listed(g.writes)}"]
        if g.constants:
            parts.append(f"reading constants {_listed(g.constants)}")
        if g.reads:
            parts.append(f"reading {_listed(g.reads)}")
        return "; ".join(parts) + f"; {other} has none (e.g. {side}'s {g.example!r})"
    parts = []
    if ga.ops != gb.ops:
        parts.append(f"{ga.ops} {kind} ops in A ({_listed(ga.types)}), {gb.ops} in B ({_listed(gb.types)})")
    for what, xa, xb in (("write", ga.writes, gb.writes), ("read the constants", ga.constants, gb.constants),
                         ("read", ga.reads, gb.reads)):
        only_a, only_b = _only(xa, xb), _only(xb, xa)
        if only_a or only_b:
            parts.append(f"{what}: A {_listed(only_a)} where B {_listed(only_b)}")
    if not parts:
        parts.append(f"the same {ga.ops} {kind} op(s) on both sides, with tensors of other sizes")
    return "; ".join(parts) + f" (e.g. A's {ga.example!r}, B's {gb.example!r})"


def _load_time(program: MilProgram) -> int:
    """How many ``constexpr_*`` ops a program has: weights decompressed once, at load."""
    return sum(op.type.startswith("constexpr_") for op in program.ops)


def _per_call(ga: OpGroup, gb: OpGroup, load_time: dict[str, int]) -> list[str]:
    """A side whose ops here decompress weights on every call (what those op types do), beside the other side's
    load-time decompression when it has any."""
    out = []
    for side, g, other in (("A", ga, "B"), ("B", gb, "A")):
        per_call = tuple((t, n) for t, n in g.types if t in PER_CALL_DECOMPRESSION)
        if per_call:
            once = (f", where {other} decompresses its weights once, at load ({load_time[other]} constexpr_* ops)"
                    if load_time[other] else "")
            out.append(f"{side} decompresses weights on every call ({_listed(per_call)}){once}")
    return out


def _by_kind(x: Analysis) -> tuple[dict[str, Counter], Counter, dict[str, set[str]], dict[tuple[str, str], list]]:
    """Bytes per category per op kind, op count per kind, the op types behind each kind, and the ops of each
    (category, kind) that carry bytes of it."""
    ops = x.program.ops
    per: dict[str, Counter] = {c: Counter() for c in CATEGORIES}
    carriers: dict[tuple[str, str], list[OpRecord]] = defaultdict(list)
    for row in x.account.ops:
        for c in CATEGORIES:
            if row.get(c):
                kind = ops[row.index].kind
                per[c][kind] += row.get(c)
                carriers[(c, kind)].append(ops[row.index])
    types: dict[str, set[str]] = defaultdict(set)
    for op in ops:
        types[op.kind].add(op.type)
    return per, Counter(op.kind for op in ops), types, carriers


def stored_differences(a: Analysis, b: Analysis) -> str:
    """How A and B store each compressed part where they differ: scheme, granularity (LUT groups and the axis they
    split, block size), stored dtypes (LUT, scale), from each program's ``compression_report``; ``""`` when neither
    is compressed or they store every part alike."""
    def ways(x: Analysis) -> dict[str, set[str]]:
        out: dict[str, set[str]] = defaultdict(set)
        for w in compression_report(x.program).weights:
            if w.compressed:
                out["+".join(w.parts)].add(" ".join(v for v in (w.scheme, w.granularity, f"({w.stored_dtypes})"
                                                                  if w.stored_dtypes else "") if v))
        return out

    wa, wb = ways(a), ways(b)
    texts = []
    for part in sorted(set(wa) | set(wb)):
        if wa.get(part) != wb.get(part):
            texts.append(f"{part}: A {'; '.join(sorted(wa.get(part, ()))) or 'uncompressed'}, "
                         f"B {'; '.join(sorted(wb.get(part, ()))) or 'uncompressed'}")
    return "stored differently: " + " | ".join(texts) if texts else ""


def explain(a: Analysis, b: Analysis) -> tuple[Reason, ...]:
    """A reason for each per-kind part of every byte-category difference and every op-count (by kind) difference
    between ``a`` and ``b``; the parts of a category add up to its difference exactly, and each says what the two
    graphs' ops of that kind differ in."""
    (bytes_a, count_a, types_a, ops_a), (bytes_b, count_b, types_b, ops_b) = _by_kind(a), _by_kind(b)
    compressed = any(op.type in PER_CALL_DECOMPRESSION or op.type.startswith("constexpr_")
                     for x in (a, b) for op in x.program.ops)
    stored = stored_differences(a, b) if compressed else ""
    load_time = {"A": _load_time(a.program), "B": _load_time(b.program)}
    out: list[Reason] = []
    for c in CATEGORIES:
        for kind in sorted(set(bytes_a[c]) | set(bytes_b[c])):
            xa, xb = bytes_a[c][kind], bytes_b[c][kind]
            if xa == xb:
                continue
            ga = OpGroup.of(a.program, ops_a.get((c, kind), []))
            gb = OpGroup.of(b.program, ops_b.get((c, kind), []))
            why = [_cause(kind, ga, gb), *_per_call(ga, gb, load_time)]
            if stored and c == "weights" and (kind in PER_CALL_DECOMPRESSION or kind in ("linear", "gather", "matmul")):
                why.append(stored)
            out.append(Reason(c, kind, xa, xb, "; ".join(why)))
    for kind in sorted(set(count_a) | set(count_b)):
        if count_a[kind] != count_b[kind]:
            out.append(Reason("ops", kind, count_a[kind], count_b[kind],
                              f"{count_a[kind]} vs {count_b[kind]} {kind} ops, as "
                              f"{', '.join(sorted(types_a[kind] | types_b[kind]))}"))
    return tuple(out)
