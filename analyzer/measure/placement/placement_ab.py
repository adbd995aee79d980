"""Placement of A vs B: ops and bytes per token on each device side by side, and a warning for every device off
the Neural Engine on which B (the candidate, e.g. the folded graph) has more ops or moves more bytes than A.

Why it matters: a rewrite that removes bytes can still lose if it pushes ops off the Neural Engine (a GQA
"broadcast" rewrite in a public Core ML LLM project ran 5.5x slower on an iPhone 17 Pro with ~20% of its ops on
the CPU/GPU, as its MLComputePlan showed; a standalone ``slice_update`` is a known fallback).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from analyzer import fmt
from analyzer.measure.placement.placement_join import PlacementJoin
from analyzer.measure.placement.plan_records import DEVICES, NON_ANE, Device


@dataclass(frozen=True, slots=True)
class DeviceChange:
    device: Device
    ops_a: int
    ops_b: int
    bytes_a: int
    bytes_b: int

    def to_json(self) -> dict[str, Any]:
        return {"ops": {"a": self.ops_a, "b": self.ops_b, "delta": self.ops_b - self.ops_a},
                "bytes_per_token": {"a": self.bytes_a, "b": self.bytes_b, "delta": self.bytes_b - self.bytes_a}}


@dataclass(frozen=True, slots=True)
class PlacementWarning:
    """B has more ops, or more bytes per token, than A on a device off the Neural Engine."""

    device: Device
    ops_a: int
    ops_b: int
    bytes_a: int
    bytes_b: int

    @property
    def message(self) -> str:
        parts = []
        if self.ops_b > self.ops_a:
            parts.append(f"{self.ops_b - self.ops_a:+,} ops ({self.ops_a:,} → {self.ops_b:,})")
        if self.bytes_b > self.bytes_a:
            parts.append(f"{fmt.size(self.bytes_b - self.bytes_a, 'auto', None, sign=True)} per token "
                         f"({fmt.size(self.bytes_a, 'auto', None)} → {fmt.size(self.bytes_b, 'auto', None)})")
        return f"B moves work off the Neural Engine onto the {self.device}: " + " and ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "ops_a": self.ops_a, "ops_b": self.ops_b, "bytes_per_token_a": self.bytes_a,
                "bytes_per_token_b": self.bytes_b, "message": self.message}


@dataclass(frozen=True)
class PlacementAB:
    a: PlacementJoin
    b: PlacementJoin
    devices: tuple[DeviceChange, ...]
    warnings: tuple[PlacementWarning, ...]

    def to_json(self) -> dict[str, Any]:
        return {"a": {"plan": self.a.plan_file, "matched": self.a.n_matched,
                      "unmatched_plan_ops": len(self.a.unmatched_plan),
                      "unmatched_analysis_ops": len(self.a.unmatched_analysis)},
                "b": {"plan": self.b.plan_file, "matched": self.b.n_matched,
                      "unmatched_plan_ops": len(self.b.unmatched_plan),
                      "unmatched_analysis_ops": len(self.b.unmatched_analysis)},
                "by_device": {d.device: d.to_json() for d in self.devices},
                "warnings": [w.to_json() for w in self.warnings]}


def compare_placement(a: PlacementJoin, b: PlacementJoin) -> PlacementAB:
    rows = tuple(DeviceChange(d, a.device(d).ops, b.device(d).ops, a.device(d).bytes_per_token,
                              b.device(d).bytes_per_token) for d in DEVICES)
    warnings = tuple(PlacementWarning(r.device, r.ops_a, r.ops_b, r.bytes_a, r.bytes_b) for r in rows
                     if r.device in NON_ANE and (r.ops_b > r.ops_a or r.bytes_b > r.bytes_a))
    return PlacementAB(a, b, rows, warnings)
