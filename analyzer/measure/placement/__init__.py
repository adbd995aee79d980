"""Where the ops ran: compute plans and profiler reports from devices, joined to the graph's op records.

Readers (one per format, recognised by content, :mod:`plan_formats`): qfold's compute-plan JSON (``plan_json``,
written by ``scripts/macos/profile_coreml.py`` from Core ML's ``MLComputePlan``), the two text dumps people paste
(``plan_dumps``: coreml_profiling's NSLog lines, CoreMLInspect's listing) and anemll-profile's report
(``anemll_profile``). Bad records are refused at their line with the reason, as for device logs; the rest of the
file is kept. The join (``placement_join``) attaches device and cost to the analysis's ops by output name; the
A/B (``placement_ab``) sets two joins side by side and warns when B moves work off the Neural Engine.
"""

from __future__ import annotations

from analyzer.measure.placement.name_match import UnmatchedPlanOp, is_compute
from analyzer.measure.placement.placement_ab import DeviceChange, PlacementAB, PlacementWarning, compare_placement
from analyzer.measure.placement.placement_join import (
    CategoryShare,
    DeviceTotals,
    JoinedOp,
    PlacementJoin,
    join_plan,
)
from analyzer.measure.placement.plan_formats import FORMATS, PlanFormatSpec, is_plan, parse_plan, plan_format
from analyzer.measure.placement.plan_json import plan_document
from analyzer.measure.placement.plan_records import (
    DEVICES,
    NON_ANE,
    Device,
    OpTypeTime,
    PlacedOp,
    PlacementPlan,
    PlanLimits,
    PlanTiming,
    bare_op_type,
)

__all__ = [
    "DEVICES",
    "FORMATS",
    "NON_ANE",
    "CategoryShare",
    "Device",
    "DeviceChange",
    "DeviceTotals",
    "JoinedOp",
    "OpTypeTime",
    "PlacedOp",
    "PlacementAB",
    "PlacementJoin",
    "PlacementPlan",
    "PlacementWarning",
    "PlanFormatSpec",
    "PlanLimits",
    "PlanTiming",
    "UnmatchedPlanOp",
    "bare_op_type",
    "compare_placement",
    "is_compute",
    "is_plan",
    "join_plan",
    "parse_plan",
    "plan_document",
    "plan_format",
]
