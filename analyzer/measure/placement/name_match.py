"""Which op record a plan's row names: by output name (the op type as a check), by a name a tool cut short, or by
program order for a dump that names none.

Cut names: anemll-profile prints a name longer than its column as ``..`` + its last characters (``truncName``: the
last 38 of a 40-wide column, the last 42 of a 44-wide one). A cut row matches the op whose output name ends that
way and is longer than the column; where several ops' names end that way the row is **ambiguous** and matches
nothing (listed with its candidates), unless as many identical rows name them (rows alike in every field: which
is which cannot matter). Several tables of one report may name one op (anemll-profile's Top-N, Conv Detail and
fallback tables): each table's row joins it once, and the join merges them; a second row of the same table naming
an already joined op is listed as such.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

from analyzer.analysis.record import Analysis
from analyzer.ir.coreai.dialect import kind_of
from analyzer.measure.placement.plan_records import PlacedOp

NOT_COMPUTE = ("const", "coreai.create_token", "coreai.invoke")
"""Op kinds that compute nothing on a device: a constant is data (MIL ``const``, Core AI ``coreai.constant``: the
kind, :func:`analyzer.ir.coreai.dialect.kind_of`, not the type); a Core AI token only orders state accesses
and an ``invoke`` only calls the body the walker inlines (the dialect's docstring: neither moves data).
``constexpr_*`` ops (decompression at load time) are compute ops here only if the plan lists them; an unlisted one
is not reported as unmatched."""


def is_compute(op_type: str) -> bool:
    return kind_of(op_type) not in NOT_COMPUTE and not op_type.startswith("constexpr_")


@dataclass(frozen=True, slots=True)
class UnmatchedPlanOp:
    """A plan row joined to no op record, and why. ``candidates``: the op records a cut name could be (two or
    more: the row is ambiguous)."""

    label: str  # the op's first output name, or its type and record for a dump without names
    op_type: str
    line: int | None
    why: str
    candidates: tuple[str, ...] = ()

    @property
    def ambiguous(self) -> bool:
        return len(self.candidates) > 1

    def to_json(self) -> dict[str, Any]:
        out = {"name": self.label, "type": self.op_type, "line": self.line, "why": self.why}
        if self.candidates:
            out["candidates"] = list(self.candidates)
        return out


def _type_agrees(p: PlacedOp, op_type: str) -> bool:
    if p.table == "conv_detail":  # anemll-profile lists there every op whose type contains "conv"
        return "conv" in op_type
    return p.bare_type == op_type


def _alike(rows: Sequence[PlacedOp]) -> bool:
    return len({(r.bare_type, r.preferred, r.supported, r.reason, r.estimate_ms, r.moved_bytes, r.bound)
                for r in rows}) == 1


def by_name(plan_ops: Sequence[PlacedOp], analysis: Analysis) -> tuple[list[tuple[int, PlacedOp]],
                                                                        list[UnmatchedPlanOp]]:
    """(op index, plan row) pairs, an op index appearing once per table that names it, and the rows that match
    no op record (with why)."""
    ops = analysis.program.ops
    by_output: dict[str, int] = {}
    by_inputs: dict[tuple[str, tuple[str, ...]], list[int]] = defaultdict(list)  # ops without outputs
    for op in ops:
        for t in op.outputs:
            by_output.setdefault(t.name, op.index)
        if not op.outputs:
            by_inputs[(op.type, tuple(sorted(r.tensor.name for r in op.inputs)))].append(op.index)
    pairs: list[tuple[int, PlacedOp]] = []
    unmatched: list[UnmatchedPlanOp] = []
    taken: dict[tuple[int, str | None], str] = {}  # (op index, table) → the row's label that took it
    cut: dict[tuple[str, str | None], list[PlacedOp]] = defaultdict(list)

    def take(index: int, p: PlacedOp) -> None:
        if not _type_agrees(p, ops[index].type):
            unmatched.append(UnmatchedPlanOp(p.label, p.op_type, p.line, f"op type differs: the analysis has "
                                             f"{ops[index].type} {ops[index].name!r}"))
        elif (index, p.table) in taken:
            unmatched.append(UnmatchedPlanOp(p.label, p.op_type, p.line, f"the op record {ops[index].name!r} is "
                                             f"already joined to {taken[index, p.table]!r}"))
        else:
            taken[index, p.table] = p.label
            pairs.append((index, p))

    for p in plan_ops:
        index = next((by_output[n] for n in p.outputs if n in by_output), None)
        if not p.outputs and p.inputs:
            hits = [i for i in by_inputs.get((p.bare_type, tuple(sorted(p.inputs))), [])
                    if (i, p.table) not in taken]
            if hits:
                take(hits[0], p)
            else:
                unmatched.append(UnmatchedPlanOp(p.label, p.op_type, p.line, "no op record without outputs reads "
                                                 "these inputs"))
        elif index is not None:
            take(index, p)
        elif p.outputs and p.outputs[0].startswith("..") and len(p.outputs[0]) > 2:
            cut[p.outputs[0][2:], p.table].append(p)
        else:
            unmatched.append(UnmatchedPlanOp(p.label, p.op_type, p.line, "no op record has this output name"))
    tails: dict[int, dict[str, set[int]]] = {}  # tail length → tail → the ops whose longer name ends that way
    for (tail, _), rows in cut.items():
        if len(tail) not in tails:
            tails[len(tail)] = defaultdict(set)
            for name, i in by_output.items():
                if len(name) > len(tail) + 2:
                    tails[len(tail)][name[-len(tail):]].add(i)
        hits = sorted(i for i in tails[len(tail)].get(tail, ()) if _type_agrees(rows[0], ops[i].type))
        if hits and len(hits) == len(rows) and _alike(rows):
            for index, p in zip(hits, rows, strict=True):  # n identical rows, n ops with that tail: those ops
                take(index, p)
            continue
        names = tuple(ops[i].name for i in hits)
        shown = ", ".join(map(repr, names[:3])) + (" …" if len(names) > 3 else "")
        why = ("no op record's name ends this way" if not hits else
               f"ambiguous: the cut name ends {len(hits)} op records' names ({shown}) and {len(rows)} row(s) of "
               "this table have it" if len(hits) > 1 or len(rows) > 1 else
               f"the cut name ends one op record's name ({shown}) but {len(rows)} rows differ")
        unmatched += [UnmatchedPlanOp(p.label, p.op_type, p.line, why, names) for p in rows]
    return pairs, unmatched


def by_order(plan_ops: Sequence[PlacedOp], analysis: Analysis) -> tuple[list[tuple[int, PlacedOp]],
                                                                         list[UnmatchedPlanOp]]:
    """A dump with no names: its ops and the analysis's top-level compute ops aligned by op type in program
    order (``difflib.SequenceMatcher``)."""
    ops = [op for op in analysis.program.ops if op.parent is None and op.kind not in NOT_COMPUTE]
    a_types = [op.type for op in ops]
    p_types = [p.bare_type for p in plan_ops]
    pairs: list[tuple[int, PlacedOp]] = []
    used: set[int] = set()
    for block in SequenceMatcher(None, p_types, a_types, autojunk=False).get_matching_blocks():
        for k in range(block.size):
            pairs.append((ops[block.b + k].index, plan_ops[block.a + k]))
            used.add(block.a + k)
    unmatched = [UnmatchedPlanOp(p.label, p.op_type, p.line, "no op of this type at this place in the program "
                                 "order") for k, p in enumerate(plan_ops) if k not in used]
    return pairs, unmatched
