"""Whether every figure of an analysis could be computed: a figure qfold could not compute is said to be missing,
with why, never shown as a zero.

An analysis is **sized** when none of these holds:

- the program could not be sized at its assumed shapes (:attr:`MilProgram.sizing_error`: the MIL interpreter's
  failure, naming the op and the cause), so its symbolic tensors keep no size;
- a copy op (a candidate KV replication: MIL ``tile``, Core AI ``tile`` / ``broadcast_in_dims``) has no size (a
  symbolic dimension: its bytes are in no category) or no verdict (the classifier could not read or evaluate its
  chain, ``tile_kind`` ``unclassified``: whether its bytes are replication is unknown); these are the **unsized
  copies**, counted beside the tile count;
- any other tensor an op reads or writes has no size (:attr:`ByteAccount.unsized`): its bytes are in no total.

Each cause is one line (:attr:`Sizing.reasons`): what the CLI prints as a warning on stderr (an error with
``--strict``), ``--json`` gives as ``unsized_reason`` (the first) and the dashboard shows where the figure is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analyzer.analysis.byte_account import UnsizedTensor
from analyzer.analysis.summary import ProgramSummary, TileRow
from analyzer.ir.mil_records import MilProgram
from analyzer.ir.opfacts import UNCLASSIFIED

# How many ops or tensors a reason names before it says "and N more".
NAMED = 3


@dataclass(frozen=True, slots=True)
class UnsizedCopy:
    """A copy op whose bytes or verdict are unknown, and why."""

    name: str
    op_type: str
    layer: int | None
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "op_type": self.op_type, "layer": self.layer, "why": self.why}


@dataclass(frozen=True, slots=True)
class Sizing:
    """What an analysis could not compute: ``reasons`` one line per cause (none: ``sized``)."""

    reasons: tuple[str, ...]
    unsized_copies: tuple[UnsizedCopy, ...]

    @property
    def sized(self) -> bool:
        return not self.reasons

    @property
    def unsized_reason(self) -> str | None:
        return self.reasons[0] if self.reasons else None

    def to_json(self) -> dict[str, Any]:
        return {"sized": self.sized, "unsized_reason": self.unsized_reason,
                "unsized_copies": len(self.unsized_copies), "unsized_reasons": list(self.reasons),
                "unsized_copy_ops": [c.to_json() for c in self.unsized_copies]}


def unsized_copies(rows: tuple[TileRow, ...]) -> tuple[UnsizedCopy, ...]:
    """The copy ops (a program summary's ``rows``) without a size or without a verdict, and why."""
    out = []
    for row in rows:
        if not row.unsized:
            continue
        why = []
        if row.output_bytes is None:
            why.append(f"output {row.output_text} has no size")
        if row.kind == UNCLASSIFIED:
            why.append(f"no verdict on KV replication ({row.reason})")
        out.append(UnsizedCopy(row.name, row.op_type, row.layer, "; ".join(why)))
    return tuple(out)


def _named(items: list[str]) -> str:
    more = len(items) - NAMED
    return ", ".join(items[:NAMED]) + (f" and {more} more" if more > 0 else "")


def sizing_of(program: MilProgram, summary: ProgramSummary, unsized_tensors: tuple[UnsizedTensor, ...]) -> Sizing:
    """The :class:`Sizing` of a program (its ``summary``) whose byte account left ``unsized_tensors`` out of its
    totals."""
    reasons = []
    if program.sizing_error is not None:
        reasons.append(f"not sized: {program.sizing_error}")
    copies = unsized_copies(summary.tiles)
    if copies:
        reasons.append(f"{len(copies)} copy op(s) without a size or a verdict, so the replication figures leave "
                       f"them out: " + _named([f"{c.name!r} ({c.op_type}): {c.why}" for c in copies]))
    copy_names = {c.name for c in copies}
    tensors = [u for u in unsized_tensors if u.op_name not in copy_names]
    if tensors:
        names = list(dict.fromkeys(f"{u.tensor!r} {u.shape} of op {u.op_name!r}" for u in tensors))
        reasons.append(f"{len(names)} tensor(s) have no size (a symbolic dimension or a type without one) and are "
                       f"in no byte total: " + _named(names))
    return Sizing(tuple(reasons), copies)
