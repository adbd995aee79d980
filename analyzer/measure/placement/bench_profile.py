"""qfold's own ``bench --profile-out P.json``: the Core AI runtime's profiler, per op, already joined to op records.

Written by ``analyzer/measure/bench.py`` (``profile_json``; branch ``coreai-run`` @ b862cda, 2026-12-01)::

    {"machine": {"cpu_model": …, "cores": 2, "os": "Linux …", "runtime_version": "1.0.0b3",
                 "compute_units": "CPU (single-threaded)", "device": "…"},
     "targets": [{"label": "<build key>", "path": "….aimodel", "join": "joined … ms …",
                  "time_by_category_ms": {…}, "profile_ms_per_token": 12.3,
                  "ops": [{"index": 17, "type": "matmul", "name": "…", "layer": 0, "category": "kv_read",
                           "time_ms": 0.41, "bytes_per_token": 4194304}, …]}]}

Each target is read as one function named by its ``label`` (a build key by default, by which the join picks the
target of an analysis); each op as placed on the device the runtime ran it on: the CPU (the Linux Core AI runtime
runs on the CPU, single-threaded: ``compute_units``), with its profiled ``time_ms`` per decode token. The time by
byte category is recomputed by the join from qfold's byte account, not copied.
"""

from __future__ import annotations

import math
from typing import Any

from analyzer.measure.logs.rows import Collector, RejectError
from analyzer.measure.placement.plan_json import json_record, refused
from analyzer.measure.placement.plan_records import PlacedOp, PlanLimits


def looks_like(doc: Any) -> bool:
    return (isinstance(doc, dict) and isinstance(doc.get("machine"), dict) and isinstance(doc.get("targets"), list)
            and all(isinstance(t, dict) and "ops" in t for t in doc["targets"]))


def _problem(op: Any) -> str | None:
    if not isinstance(op, dict):
        return "not an object"
    if not isinstance(op.get("name"), str) or not op["name"]:
        return "'name' must be the op record's name"
    if not isinstance(op.get("type"), str) or not op["type"]:
        return "'type' must be the op's type"
    t = op.get("time_ms")
    if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t < 0:
        return f"'time_ms' is {t!r}: a non-negative number of ms per decode token"
    return None


def read(doc: dict, col: Collector, limits: PlanLimits, lines: list[int]) -> tuple[list[PlacedOp], dict]:
    units = doc["machine"].get("compute_units")
    if not isinstance(units, str) or not units.startswith("CPU"):
        raise RejectError(f"machine.compute_units {units!r}: qfold reads bench profiles of the CPU runtime",
                          column="machine.compute_units")
    ops: list[PlacedOp] = []
    labels: list[str] = []
    for k, target in enumerate(doc["targets"]):
        label = target.get("label")
        if not isinstance(label, str) or not label or not isinstance(target.get("ops"), list):
            raise RejectError(f"targets[{k}] must have a 'label' and a list of 'ops'", column="targets")
        if label in labels:
            raise RejectError(f"target {label!r} is listed twice", column="targets")
        labels.append(label)
        for i, op in enumerate(target["ops"]):
            record, line = json_record(col, limits, lines)
            if refused(col, record, line, f"targets[{k}].ops[{i}]", _problem(op)):
                continue
            ops.append(PlacedOp(label, (op["name"],), op["type"], "CPU", ("CPU",), None, None, line, record,
                                time_ms=float(op["time_ms"])))
    machine = doc["machine"].get("device")
    return ops, {"functions": tuple(labels), "compute_units": units,
                 "source": machine if isinstance(machine, str) else None}
