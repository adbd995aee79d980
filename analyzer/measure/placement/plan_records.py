"""The records of a placement plan: where a device put each op, what it cost, and what the reader refused.

A plan comes from one of the formats in :mod:`analyzer.measure.placement.plan_formats` (Core ML's ``MLComputePlan`` as
qfold's companion writes it, the text dumps other tools print, anemll-profile's report). Devices are named
``ANE`` (the Neural Engine), ``GPU`` and ``CPU`` whatever the tool called them. Problems are
:class:`~analyzer.measure.logs.LogIssue` records, as for device logs: a bad record is refused at its line, with the
reason, and the rest of the file is kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from analyzer.measure.logs import LogIssue

Device = Literal["ANE", "GPU", "CPU"]
DEVICES: tuple[Device, ...] = ("ANE", "GPU", "CPU")
NON_ANE: tuple[Device, ...] = ("GPU", "CPU")
Coverage = Literal["every_op", "off_ane_only", "op_counts"]
"""``every_op``: the plan lists every op it placed (an op it does not list is unmatched). ``off_ane_only``: the
plan lists only the ops *not* on the Neural Engine (anemll-profile's fallback table); the analysis's other compute
ops are counted on the Neural Engine, and the join says so. ``op_counts``: the plan counts ops per name and places
none (``coreai-build inspect``): the join compares the counts and places nothing."""
Matching = Literal["by_name", "by_order"]
"""``by_name``: ops carry their output names (joined by name, op type as a check). ``by_order``: the dump names no
outputs (``operation ios17.conv, device …``), so ops are aligned by program order and op type."""

_OPSET_PREFIX = re.compile(r"^ios\d+\.")


def bare_op_type(op_type: str) -> str:
    """``ios18.linear`` → ``linear``: Core ML names ops with their opset; MIL records do not."""
    return _OPSET_PREFIX.sub("", op_type.strip())


@dataclass(frozen=True, slots=True)
class PlanLimits:
    """Ceilings checked before a plan is parsed. Judgement: a full-size 8B decode step has ~6,000 ops and its
    compute-plan JSON ~1 MB; 64 MiB and 500,000 ops leave room for multi-function packages of large models."""

    max_file_bytes: int = 64 * 2**20
    max_ops: int = 500_000


DEFAULT_PLAN_LIMITS = PlanLimits()


@dataclass(frozen=True, slots=True)
class PlacedOp:
    """One op as the device planned it. ``cost_weight`` is Core ML's estimated share of the function's work
    (0-1; None when the tool gives none, as for constants); ``reason`` says why it is off the Neural Engine when
    the tool says so."""

    function: str
    outputs: tuple[str, ...]  # output names; () for a dump that names none (by_order)
    op_type: str  # as printed ("ios18.linear", "conv")
    preferred: Device | None  # None: no device usage (constants)
    supported: tuple[Device, ...]
    cost_weight: float | None
    reason: str | None
    line: int | None  # None: a JSON document whose op objects could not be told apart by line
    record: int
    inputs: tuple[str, ...] = ()  # the names an op without outputs reads (write_state): how it is joined
    time_ms: float | None = None  # profiled time per decode token (qfold's bench profiles)
    table: str | None = None  # which table of a report named it (anemll-profile: TABLES)
    estimate_ms: float | None = None  # a cost model's estimated time of the op (anemll-profile's ms)
    moved_bytes: int | None = None  # bytes the source says the op moves (anemll-profile's MB × 10^6)
    bytes_per_s: float | None = None  # the source's bandwidth for the op (anemll-profile's GB/s × 10^9)
    bound: str | None = None  # what the source says limits the op: "Memory", "Compute"

    @property
    def bare_type(self) -> str:
        return bare_op_type(self.op_type)

    @property
    def label(self) -> str:
        """How a message names the op: its first output, else its type and line."""
        if self.outputs:
            return self.outputs[0]
        return f"{self.op_type}({', '.join(self.inputs)})" if self.inputs else f"{self.op_type} (record {self.record})"


TABLES: dict[str, str] = {"top_ops": "Top N Most Expensive Operations", "conv_detail": "Conv Detail",
                          "fallback": "CPU/GPU Fallback Ops"}
"""anemll-profile's tables that name ops, by the key a :class:`PlacedOp` carries as ``table``."""


@dataclass(frozen=True, slots=True)
class OpTypeTime:
    """A row of anemll-profile's "Op-Type Runtime Breakdown": the cost model's time for every op of a type."""

    op_type: str
    count: int
    ms_per_op: float
    total_time_ms: float
    gflop: float
    gb_per_s: float
    share_percent: float
    bound: str  # "Comp", "Mem" or "?"
    line: int


@dataclass(frozen=True, slots=True)
class PlanTiming:
    """anemll-profile's measured prediction: ``Measured: … ms/prediction (… iter/s, N runs)`` and ``Weight BW``."""

    ms_per_prediction: float
    iter_per_s: float
    runs: int
    weight_bytes_per_s: float | None
    line: int


@dataclass(frozen=True, slots=True)
class PlacementPlan:
    """One file read as a placement plan. ``accepted`` False: the file was refused whole (``issues`` says why)."""

    file_name: str
    format: str | None
    accepted: bool
    ops: tuple[PlacedOp, ...] = ()
    functions: tuple[str, ...] = ()
    coverage: Coverage = "every_op"
    matching: Matching = "by_name"
    compute_units: str | None = None
    source: str | None = None  # what the file says it was made from (a package name)
    op_type_times: tuple[OpTypeTime, ...] = ()
    timing: PlanTiming | None = None
    n_records: int = 0
    issues: tuple[LogIssue, ...] = ()
    notes: tuple[str, ...] = ()  # what the reader could not take from the format, said once
    op_counts: tuple[tuple[str, int], ...] = ()  # ops per operation name (coreai-build inspect)
    signatures: tuple[tuple, ...] = ()  # (function, inputs, outputs, states), each value (name, type name)
    compute_types: tuple[str, ...] = ()

    @property
    def errors(self) -> tuple[LogIssue, ...]:
        return tuple(i for i in self.issues if i.severity == "error")

    def function_ops(self, function: str) -> tuple[PlacedOp, ...]:
        return tuple(op for op in self.ops if op.function == function)
