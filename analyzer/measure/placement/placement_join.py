"""The join: a placement plan's devices and costs attached to an analysis's op records.

By name: a plan op is the analysis op that has one of its output names (MIL ops are known by their outputs), and
the op types must agree (``ios18.linear`` is ``linear``); anemll-profile's names cut to ``..suffix`` match the one
op whose name ends that way, and a cut name several ops share matches none (listed as ambiguous). By order (a dump
with no names): the plan's ops and the analysis's top-level non-constant ops are aligned by op type in program order
(:mod:`name_match`). Rows of several tables naming one op (anemll-profile's Top-N, Conv Detail and fallback) are
merged into that op's one record: the fallback row's device, the cost tables' time, bytes, bandwidth and bound; the
op counts once in ``matched``. Nothing is dropped: a plan
op that matches no op record, or matches one of another type, is listed in ``unmatched_plan`` with the reason; an
analysis compute op the plan does not mention is listed in ``unmatched_analysis`` (for a plan that lists only the
ops off the Neural Engine, those are counted on the Neural Engine instead, marked ``inferred``).

Per device: the ops and the logical bytes per token they move (:mod:`analyzer.analysis.accounting`), and the cost
weight. Per byte category: the share of the cost (or of anemll-profile's cost-model time) spent in ops moving
that category's bytes, each op's cost split over its categories by its bytes
(:func:`analyzer.analysis.accounting.split_by_bytes`, the attribution bench's profile makes too).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.analysis.accounting import CATEGORIES, OpBytes, split_by_bytes
from analyzer.analysis.record import Analysis
from analyzer.errors import QfoldError
from analyzer.measure.placement.name_match import UnmatchedPlanOp, by_name, by_order, is_compute
from analyzer.measure.placement.plan_records import (
    DEVICES,
    NON_ANE,
    Coverage,
    Device,
    Matching,
    PlacedOp,
    PlacementPlan,
    bare_op_type,
)

NO_BYTES = "no_bytes"
SHARE_BUCKETS: tuple[str, ...] = (*CATEGORIES, NO_BYTES, "unmatched")
"""``no_bytes``: cost of ops that move no bytes of their own (views); ``unmatched``: cost of plan ops (or op types)
that match no op record."""


@dataclass(frozen=True, slots=True)
class JoinedOp:
    """An analysis op with where the plan put it. ``inferred``: not in the plan, counted on the Neural Engine
    because the plan lists only the ops off it."""

    index: int
    name: str
    op_type: str
    layer: int | None
    device: Device | None  # None: the plan gives the op no device (a constant)
    supported: tuple[Device, ...]
    cost_weight: float | None
    reason: str | None
    inferred: bool
    bytes: OpBytes
    time_ms: float | None = None  # profiled time per decode token (bench profiles)
    tables: tuple[str, ...] = ()  # the report's tables that name the op (plan_records.TABLES keys)
    estimate_ms: float | None = None  # a cost model's estimated time (anemll-profile)
    moved_bytes: int | None = None  # bytes the source says the op moves (not the analysis's ``bytes``)
    bytes_per_s: float | None = None
    bound: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "type": self.op_type, "layer": self.layer,
                "device": self.device, "supported": list(self.supported), "cost": self.cost_weight,
                "reason": self.reason, "inferred": self.inferred, "bytes_per_token": self.bytes.total}

    def matched_json(self) -> dict[str, Any]:
        """The op as ``placement --json`` lists it in ``matched_ops``: where it ran and what the source measured or
        estimated for it (None where the source gives nothing); ``time_basis`` says which time ``time_ms`` is."""
        time_ms, basis = ((self.time_ms, "profiled, per decode token") if self.time_ms is not None else
                          (self.estimate_ms, "cost-model estimate") if self.estimate_ms is not None else (None, None))
        return {"index": self.index, "name": self.name, "type": self.op_type, "layer": self.layer,
                "device": self.device, "tables": list(self.tables), "time_ms": time_ms, "time_basis": basis,
                "bytes": self.moved_bytes, "bytes_per_s": self.bytes_per_s, "bound": self.bound,
                "bytes_per_token": self.bytes.total}


@dataclass(frozen=True, slots=True)
class DeviceTotals:
    """The matched ops the plan put on one device, and what they move per token (ints, bytes)."""

    device: Device
    ops: int
    bytes_per_token: int
    cost_weight: float | None  # sum of the ops' cost weights; None when the plan gives no costs
    category_bytes: tuple[tuple[str, int], ...]
    time_ms: float | None = None  # sum of the ops' profiled ms per token; None when the plan has no times

    def to_json(self) -> dict[str, Any]:
        return {"ops": self.ops, "bytes_per_token": self.bytes_per_token, "cost": self.cost_weight,
                "time_ms": self.time_ms, "bytes_by_category": dict(self.category_bytes)}


@dataclass(frozen=True, slots=True)
class CategoryShare:
    """Share of the plan's cost (``basis`` "cost weight") or cost-model time ("cost-model time, ms") in ops moving
    one byte category's bytes."""

    category: str
    amount: float
    share: float
    basis: str


@dataclass(frozen=True, slots=True)
class Segments:
    """The Neural Engine and GPU regions of a placement: maximal runs of compute ops on one of them in program order
    (a constant or an op the plan gives no device does not cut a run; an op on another device does)."""

    total: int
    by_device: tuple[tuple[str, int], ...]  # ("ANE", n), ("GPU", m)


def segments_of(matched: Sequence[JoinedOp]) -> Segments:
    runs: dict[str, int] = {"ANE": 0, "GPU": 0}
    current: str | None = None
    for op in sorted(matched, key=lambda o: o.index):
        if op.device is None:
            continue
        if op.device != current and op.device in runs:
            runs[op.device] += 1
        current = op.device
    return Segments(sum(runs.values()), tuple(runs.items()))


@dataclass(frozen=True)
class PlacementJoin:
    plan_file: str
    plan_format: str | None
    plan_function: str | None  # None: the plan names no function (anemll-profile)
    analysis_function: str
    coverage: Coverage
    matching: Matching
    matched: tuple[JoinedOp, ...]
    unmatched_plan: tuple[UnmatchedPlanOp, ...]
    unmatched_analysis: tuple[str, ...]
    by_device: tuple[DeviceTotals, ...]  # ANE, GPU, CPU, always all three
    unplaced_bytes_per_token: int  # bytes of the analysis's compute ops the join could not place
    category_shares: tuple[CategoryShare, ...]
    notes: tuple[str, ...]
    segments: Segments | None = None  # None: the plan gives no placement in program order (``segments_why``)
    segments_why: str = ""
    op_counts: tuple[tuple[str, int, int], ...] = ()  # (operation name, the plan's count, the analysis's)

    @property
    def n_matched(self) -> int:
        """Plan ops joined to an op record (not counting ops inferred on the Neural Engine)."""
        return sum(1 for op in self.matched if not op.inferred)

    def device(self, device: Device) -> DeviceTotals:
        return next(d for d in self.by_device if d.device == device)

    @property
    def off_ane(self) -> tuple[JoinedOp, ...]:
        """Compute ops not on the Neural Engine, costliest first (then most bytes)."""
        ops = [op for op in self.matched if op.device in NON_ANE]
        return tuple(sorted(ops, key=lambda o: (-(o.cost_weight or 0), -o.bytes.total, o.index)))

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": self.plan_file, "format": self.plan_format, "plan_function": self.plan_function,
            "function": self.analysis_function, "coverage": self.coverage, "matching": self.matching,
            "matched": self.n_matched,
            "matched_ops": [op.matched_json() for op in self.matched if not op.inferred],
            "unmatched": {"plan_ops": [u.label for u in self.unmatched_plan],
                          "analysis_ops": list(self.unmatched_analysis)},
            "unmatched_plan_ops": [u.to_json() for u in self.unmatched_plan],
            "ambiguous": [u.to_json() for u in self.unmatched_plan if u.ambiguous],
            "by_device": {d.device: d.to_json() for d in self.by_device},
            "unplaced_bytes_per_token": self.unplaced_bytes_per_token,
            "off_ane": [op.to_json() for op in self.off_ane],
            "share_by_category": [{"category": s.category, "amount": s.amount, "share": s.share, "basis": s.basis}
                                  for s in self.category_shares],
            "segments": None if self.segments is None else self.segments.total,
            "segments_by_device": None if self.segments is None else dict(self.segments.by_device),
            "segments_basis": self.segments_why,
            "op_counts": [{"operation": n, "plan": p, "analysis": a} for n, p, a in self.op_counts],
            "notes": list(self.notes),
        }


def plan_function(plan: PlacementPlan, analysis_function: str, function: str | None = None,
                  build_key: str | None = None) -> str | None:
    """Which of the plan's functions is joined: ``function`` if given, else the analysis's own, else the one named
    by the analysis's build key (a bench profile's targets), else the plan's only one; None for a plan that names
    no functions."""
    if not plan.functions:
        return None
    if function is not None:
        if function not in plan.functions:
            raise QfoldError(f"{plan.file_name}: no function {function!r} (the plan has "
                             f"{', '.join(plan.functions)})")
        return function
    if analysis_function in plan.functions:
        return analysis_function
    if build_key is not None and build_key in plan.functions:
        return build_key
    if len(plan.functions) == 1:
        return plan.functions[0]
    raise QfoldError(f"{plan.file_name}: functions {', '.join(plan.functions)}, none named like the analysis's "
                     f"{analysis_function!r}{f' or its build {build_key!r}' if build_key else ''}: pick one with "
                     "--plan-function")


def join_plan(plan: PlacementPlan, analysis: Analysis, function: str | None = None) -> PlacementJoin:
    """Attach ``plan``'s placement to ``analysis``'s ops (see the module docstring). QfoldError for a refused plan
    or a function the plan does not have."""
    if not plan.accepted:
        raise QfoldError(f"{plan.file_name}: not a usable placement plan: "
                         + "; ".join(i.message for i in plan.errors))
    chosen = plan_function(plan, analysis.function, function, analysis.build.key if analysis.build else None)
    plan_ops = [op for op in plan.ops if chosen is None or op.function == chosen]
    ops = analysis.program.ops
    acct = analysis.account.ops
    pairs, unmatched = (by_order if plan.matching == "by_order" else by_name)(plan_ops, analysis)
    rows: dict[int, list[PlacedOp]] = defaultdict(list)
    for i, p in pairs:
        rows[i].append(p)
    joined = {i: _merged(i, analysis, found) for i, found in rows.items()}
    missing = [op.index for op in ops if is_compute(op.type) and op.index not in joined]
    notes = list(plan.notes)
    unmatched_analysis: tuple[str, ...] = ()
    if plan.coverage == "op_counts":
        return _counts_join(plan, analysis, chosen, notes)
    if plan.coverage == "off_ane_only":
        for i in missing:
            joined[i] = JoinedOp(i, ops[i].name, ops[i].type, ops[i].layer, "ANE", (), None, None, True, acct[i])
        unplaced = 0
        if unmatched:
            notes.append(f"{len(unmatched)} of the plan's off-Neural-Engine rows match no single op record: the "
                         "ops counted on the Neural Engine may include them")
    else:
        unmatched_analysis = tuple(ops[i].name for i in missing)
        unplaced = sum(acct[i].total for i in missing)
    matched = tuple(joined[i] for i in sorted(joined))
    if chosen is not None and chosen != analysis.function:
        notes.append(f"the plan's function {chosen!r} is joined to the analysis's {analysis.function!r}")
    placed = any(op.device is not None for op in matched)
    why = ("the plan puts no op on a device: no regions to count" if not placed else
           "derived: runs of compute ops on the Neural Engine or the GPU in program order"
           + (", the ops the report does not list counted on the Neural Engine" if plan.coverage == "off_ane_only"
              else ""))
    return PlacementJoin(plan.file_name, plan.format, chosen, analysis.function, plan.coverage, plan.matching,
                         matched, tuple(unmatched), unmatched_analysis, _totals(matched, plan), unplaced,
                         _shares(matched, unmatched, plan, plan_ops, analysis), tuple(notes),
                         segments_of(matched) if placed else None, why)


def _counts_join(plan: PlacementPlan, analysis: Analysis, chosen: str | None, notes: list[str]) -> PlacementJoin:
    """A plan that counts ops per name and places none: its counts beside the analysis's, nothing placed."""
    ops = analysis.program.ops
    have: dict[str, int] = defaultdict(int)
    for op in ops:
        have[op.type] += 1
    counts = []
    for name, n in plan.op_counts:
        mine = name if name in have else f"coreai.{name}"  # the summary may name ops without their dialect
        counts.append((name, n, have.get(mine, 0)))
    differ = [c for c in counts if c[1] != c[2]]
    notes.append(f"{len(counts) - len(differ)} of {len(counts)} operation counts agree with the analysis's op types"
                 + (f"; differ: {', '.join(f'{n} {p} vs {a}' for n, p, a in differ[:8])}" if differ else ""))
    unplaced = sum(analysis.account.ops[op.index].total for op in ops if is_compute(op.type))
    return PlacementJoin(plan.file_name, plan.format, chosen, analysis.function, plan.coverage, plan.matching, (),
                         (), (), _totals((), plan), unplaced, (), tuple(notes), None,
                         "coreai-build inspect's summary gives no regions", tuple(counts))


def _merged(i: int, analysis: Analysis, rows: Sequence[PlacedOp]) -> JoinedOp:
    """One op record from the plan rows that name it (one per table): the device the compute plan or fallback
    table gives wins over the cost model's Neural Engine; times, bytes and bound come from the first row with
    them."""
    op = analysis.program.ops[i]
    placed = next((r for r in rows if r.table in (None, "fallback")), rows[0])

    def first(field: str) -> Any:
        return next((getattr(r, field) for r in rows if getattr(r, field) is not None), None)

    tables = tuple(dict.fromkeys(r.table for r in rows if r.table is not None))
    return JoinedOp(i, op.name, op.type, op.layer, placed.preferred, placed.supported, placed.cost_weight,
                    placed.reason, False, analysis.account.ops[i], first("time_ms"), tables, first("estimate_ms"),
                    first("moved_bytes"), first("bytes_per_s"), first("bound"))


def _totals(matched: Iterable[JoinedOp], plan: PlacementPlan) -> tuple[DeviceTotals, ...]:
    has_cost = any(op.cost_weight is not None for op in plan.ops)
    has_time = any(op.time_ms is not None for op in plan.ops)
    out = []
    for device in DEVICES:
        mine = [op for op in matched if op.device == device]
        cats = tuple((c, sum(op.bytes.get(c) for op in mine)) for c in CATEGORIES)
        cost = sum(op.cost_weight or 0.0 for op in mine) if has_cost else None
        time_ms = sum(op.time_ms or 0.0 for op in mine) if has_time else None
        out.append(DeviceTotals(device, len(mine), sum(op.bytes.total for op in mine), cost, cats, time_ms))
    return tuple(out)


def _shares(matched: Sequence[JoinedOp], unmatched: Sequence[UnmatchedPlanOp], plan: PlacementPlan,
            plan_ops: Sequence[PlacedOp], analysis: Analysis) -> tuple[CategoryShare, ...]:
    into: dict[str, float] = dict.fromkeys(SHARE_BUCKETS, 0.0)
    if plan.op_type_times:
        basis = "cost-model time, ms"
        by_type: dict[str, list[OpBytes]] = defaultdict(list)
        for op in matched:
            by_type[op.op_type].append(op.bytes)
        for t in plan.op_type_times:
            rows = by_type.get(bare_op_type(t.op_type), [])
            if not rows:
                into["unmatched"] += t.total_time_ms
            else:
                split_by_bytes(t.total_time_ms, rows, into, NO_BYTES)
    elif any(p.time_ms is not None for p in plan_ops):
        basis = "profiled time, ms per token"
        times = {(p.function, p.label): p.time_ms or 0.0 for p in plan_ops}
        for op in matched:
            if op.time_ms:
                split_by_bytes(op.time_ms, (op.bytes,), into, NO_BYTES)
        labels = {u.label for u in unmatched}
        into["unmatched"] += sum(t for (_, label), t in times.items() if label in labels)
    elif any(op.cost_weight is not None for op in plan_ops):
        basis = "cost weight"
        for op in matched:
            if op.cost_weight:
                split_by_bytes(op.cost_weight, (op.bytes,), into, NO_BYTES)
        labels = {u.label for u in unmatched}
        into["unmatched"] += sum(p.cost_weight or 0.0 for p in plan_ops if p.label in labels)
    else:
        return ()
    total = sum(into.values())
    return tuple(CategoryShare(c, into[c], into[c] / total if total > 0 else 0.0, basis) for c in SHARE_BUCKETS)
