"""The join: a placement plan's devices and costs attached to an analysis's op records.

By name: a plan op is the analysis op that has one of its output names (MIL ops are known by their outputs), and
the op types must agree (``ios18.linear`` is ``linear``); anemll-profile's names cut to ``..suffix`` match the one
op whose name ends that way. By order (a dump with no names): the plan's ops and the analysis's top-level
non-constant ops are aligned by op type in program order (``difflib.SequenceMatcher``). Nothing is dropped: a plan
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
from difflib import SequenceMatcher
from typing import Any

from analyzer.analysis.accounting import CATEGORIES, OpBytes, split_by_bytes
from analyzer.analysis.record import Analysis
from analyzer.errors import QfoldError
from analyzer.ir.coreai.dialect import kind_of
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

NOT_COMPUTE = ("const", "coreai.create_token", "coreai.invoke")
"""Op kinds that compute nothing on a device: a constant is data (MIL ``const``, Core AI ``coreai.constant``: the
kind, :func:`analyzer.ir.coreai.dialect.kind_of`, not the type); a Core AI token only orders state accesses
and an ``invoke`` only calls the body the walker inlines (the dialect's docstring: neither moves data).
``constexpr_*`` ops (decompression at load time) are compute ops here only if the plan lists them; an unlisted one
is not reported as unmatched."""
NO_BYTES = "no_bytes"
SHARE_BUCKETS: tuple[str, ...] = (*CATEGORIES, NO_BYTES, "unmatched")
"""``no_bytes``: cost of ops that move no bytes of their own (views); ``unmatched``: cost of plan ops (or op types)
that match no op record."""


def is_compute(op_type: str) -> bool:
    return kind_of(op_type) not in NOT_COMPUTE and not op_type.startswith("constexpr_")


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

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "type": self.op_type, "layer": self.layer,
                "device": self.device, "supported": list(self.supported), "cost": self.cost_weight,
                "reason": self.reason, "inferred": self.inferred, "bytes_per_token": self.bytes.total}


@dataclass(frozen=True, slots=True)
class UnmatchedPlanOp:
    label: str  # the op's first output name, or its type and record for a dump without names
    op_type: str
    line: int | None
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.label, "type": self.op_type, "line": self.line, "why": self.why}


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
            "unmatched": {"plan_ops": [u.label for u in self.unmatched_plan],
                          "analysis_ops": list(self.unmatched_analysis)},
            "unmatched_plan_ops": [u.to_json() for u in self.unmatched_plan],
            "by_device": {d.device: d.to_json() for d in self.by_device},
            "unplaced_bytes_per_token": self.unplaced_bytes_per_token,
            "off_ane": [op.to_json() for op in self.off_ane],
            "share_by_category": [{"category": s.category, "amount": s.amount, "share": s.share, "basis": s.basis}
                                  for s in self.category_shares],
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
    if plan.matching == "by_order":
        pairs, unmatched = _by_order(plan_ops, analysis)
    else:
        pairs, unmatched = _by_name(plan_ops, analysis)
    joined = {i: JoinedOp(i, ops[i].name, ops[i].type, ops[i].layer, p.preferred, p.supported, p.cost_weight,
                          p.reason, False, acct[i], p.time_ms) for i, p in pairs}
    missing = [op.index for op in ops if is_compute(op.type) and op.index not in joined]
    notes = list(plan.notes)
    unmatched_analysis: tuple[str, ...] = ()
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
    return PlacementJoin(plan.file_name, plan.format, chosen, analysis.function, plan.coverage, plan.matching,
                         matched, tuple(unmatched), unmatched_analysis, _totals(matched, plan), unplaced,
                         _shares(matched, unmatched, plan, plan_ops, analysis), tuple(notes))


def _by_name(plan_ops: Sequence[PlacedOp], analysis: Analysis) -> tuple[list[tuple[int, PlacedOp]],
                                                                         list[UnmatchedPlanOp]]:
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
    taken: dict[int, str] = {}
    cut: dict[str, list[PlacedOp]] = defaultdict(list)

    def take(index: int, p: PlacedOp) -> None:
        if p.bare_type != ops[index].type:
            unmatched.append(UnmatchedPlanOp(p.label, p.op_type, p.line, f"op type differs: the analysis has "
                                             f"{ops[index].type} {ops[index].name!r}"))
        elif index in taken:
            unmatched.append(UnmatchedPlanOp(p.label, p.op_type, p.line, f"the op record {ops[index].name!r} is "
                                             f"already joined to {taken[index]!r}"))
        else:
            taken[index] = p.label
            pairs.append((index, p))

    for p in plan_ops:
        index = next((by_output[n] for n in p.outputs if n in by_output), None)
        if not p.outputs and p.inputs:
            hits = [i for i in by_inputs.get((p.bare_type, tuple(sorted(p.inputs))), []) if i not in taken]
            if hits:
                take(hits[0], p)
            else:
                unmatched.append(UnmatchedPlanOp(p.label, p.op_type, p.line, "no op record without outputs reads "
                                                 "these inputs"))
        elif index is not None:
            take(index, p)
        elif p.outputs and p.outputs[0].startswith("..") and len(p.outputs[0]) > 2:
            cut[p.outputs[0][2:]].append(p)
        else:
            unmatched.append(UnmatchedPlanOp(p.label, p.op_type, p.line, "no op record has this output name"))
    suffixes = _suffix_index(by_output) if cut else {}
    for tail, rows in cut.items():
        hits = sorted(suffixes.get(tail, []))
        alike = len({(r.bare_type, r.preferred, r.supported, r.reason) for r in rows}) == 1
        if hits and len(hits) == len(rows) and alike:
            for index, p in zip(hits, rows, strict=True):  # n identical rows, n ops with that tail: those ops
                take(index, p)
            continue
        names = ", ".join(repr(ops[i].name) for i in hits[:3]) + (" …" if len(hits) > 3 else "")
        why = ("no op record's name ends this way" if not hits else
               f"the cut name ends {len(hits)} op records' names ({names}) and {len(rows)} row(s) have it")
        unmatched += [UnmatchedPlanOp(p.label, p.op_type, p.line, why) for p in rows]
    return pairs, unmatched


def _suffix_index(by_output: dict[str, int]) -> dict[str, list[int]]:
    """anemll-profile cuts names to their last 38 characters: every such tail → the ops it could be."""
    out: dict[str, list[int]] = defaultdict(list)
    for name, index in by_output.items():
        if len(name) > 38 and index not in out[name[-38:]]:
            out[name[-38:]].append(index)
    return out


def _by_order(plan_ops: Sequence[PlacedOp], analysis: Analysis) -> tuple[list[tuple[int, PlacedOp]],
                                                                          list[UnmatchedPlanOp]]:
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
