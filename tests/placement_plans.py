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
