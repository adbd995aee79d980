"""Compute plans in qfold's JSON for the pure placement tests and the browser test, written from an analysis's own
op records with a placement rule (the join against names read from a package's Model.proto, not from the analysis,
is tests/test_placement_companion.py)."""

from __future__ import annotations

import json
from collections.abc import Callable

from analyzer.analysis.record import Analysis
from analyzer.measure.placement import plan_document

Rule = Callable[[str], str]


def all_ane(op_type: str) -> str:
    return "ANE"


def slice_update_on_cpu(op_type: str) -> str:
    """``slice_update`` is a known Neural Engine fallback (anemll-profile: "Cannot support standalone
    slice_update")."""
    return "CPU" if op_type == "slice_update" else "ANE"


def plan_bytes(analysis: Analysis, rule: Rule = all_ane, package: str = "model.mlpackage") -> bytes:
    """Every op of the analysis; constants get no device or cost (as MLComputePlan gives none), the others the
    rule's device and an equal cost weight."""
    ops = analysis.program.ops
    n = sum(1 for op in ops if op.type != "const")
    entries = []
    for op in ops:
        if op.type == "const":
            entries.append({"outputs": [t.name for t in op.outputs], "type": "const", "preferred": None,
                            "supported": [], "cost": None})
            continue
        device = rule(op.type)
        entry = {"outputs": [t.name for t in op.outputs], "type": f"ios18.{op.type}", "preferred": device,
                 "supported": sorted({device, "CPU"}), "cost": 1 / n}
        if not op.outputs:
            entry["inputs"] = [r.tensor.name for r in op.inputs]
        entries.append(entry)
    doc = plan_document(package, "ALL", [(analysis.function, entries)], {"made_by": "tests/placement_plans.py"})
    return json.dumps(doc, indent=1).encode()


# anemll-profile's report, printed with the format strings of Anemll/anemll-profile anemll_profile.m @ 821c3019f529
RULE = "═" * 63
WIDE_RULE = "═" * 91


def printf(spec: str, *args: object) -> str:
    """C's printf of one of anemll_profile.m's format strings (the same width and precision rules as Python's %)."""
    return spec % args  # the tool's own format strings, verbatim


def trunc_name(name: str, maxlen: int) -> str:
    """anemll_profile.m ``truncName``: the name, or ``..`` + its last ``maxlen - 2`` characters when longer."""
    return name if len(name) <= maxlen else ".." + name[len(name) - (maxlen - 2):]


def anemll_report(source: str, top: list[tuple[str, str, float, float, str]],
                  fallback: list[tuple[str, str, str, str, str]]) -> str:
    """A report with the Top-N table (name, type, ms, MB, bound) and the fallback table (name, type, device,
    supported, reason) as anemll-profile prints them; GB/s is MB ÷ ms, as the tool computes it."""
    lines = ["", RULE, f"  ANE CostModel Report: {source}", RULE, "", "  Format:       ML Program",
             "  Compute:      CPU+ANE", "", RULE, f"  Top {len(top)} Most Expensive Operations", RULE, "",
             printf("  %-44s %-24s %10s %8s %8s %s", "Op Name", "Type", "ms", "MB", "GB/s", "Bound"),
             printf("  %-44s %-24s %10s %8s %8s %s", "─" * 44, "─" * 24, "─" * 10, "─" * 8, "─" * 8, "─" * 6)]
    for name, op_type, ms, mb, bound in top:
        lines.append(printf("  %-44s %-24s %10.6f %8.2f %8.2f %s", trunc_name(name, 44), op_type, ms, mb,
                            mb / ms if ms > 0 else 0, bound))
    lines += ["", WIDE_RULE, f"  CPU/GPU Fallback Ops ({len(fallback)} ops not on ANE)", WIDE_RULE, "",
              printf("  %-40s %-24s %4s %-12s %s", "Output Name", "Op Type", "Dev", "Supported", "Reason"),
              printf("  %-40s %-24s %4s %-12s %s", "─" * 40, "─" * 24, "─" * 4, "─" * 12, "─" * 30)]
    for name, op_type, device, supported, reason in fallback:
        lines.append(printf("  %-40s %-24s %4s %-12s %s", trunc_name(name, 40), op_type, device, supported,
                            trunc_name(reason, 80)))
    return "\n".join([*lines, "", RULE, ""])
