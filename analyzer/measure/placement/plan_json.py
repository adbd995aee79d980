"""qfold's compute-plan JSON: what ``scripts/macos/profile_coreml.py`` writes from Core ML's ``MLComputePlan``.

One document per package and compute-unit setting::

    {"format": "qfold-compute-plan", "schema_version": 1,
     "package": "model.mlpackage", "compute_units": "ALL",
     "made_with": {"coremltools": "9.0", "macos": "15.5", "machine": "arm64"},
     "functions": [
       {"name": "main",
        "ops": [{"outputs": ["x_1_cast_fp16"], "type": "ios18.gather",
                 "preferred": "GPU", "supported": ["GPU", "CPU"], "cost": 0.0068},
                {"outputs": ["var_12"], "type": "const", "preferred": null, "supported": [], "cost": null},
                {"outputs": [], "inputs": ["k_cache", "k_cache_internal_tensor_assign_1"], "type": "ios18.write_state",
                 "preferred": "ANE", "supported": ["ANE", "CPU"], "cost": 0.0004},
                ...]}]}

Per op, from coremltools (``coremltools/models/compute_plan.py``, 9.0): ``outputs`` are
``MLModelStructureProgramOperation.outputs[i].name``, ``type`` its ``operator_name``; ``preferred`` and
``supported`` come from ``MLComputePlan.get_compute_device_usage_for_mlprogram_operation`` (its
``preferred_compute_device`` / ``supported_compute_devices``, each an ``MLCPUComputeDevice``,
``MLGPUComputeDevice`` or ``MLNeuralEngineComputeDevice``), ``cost`` from
``get_estimated_cost_for_mlprogram_operation(op).weight`` ("the estimated workload of executing the operation
over the total model execution", 0-1). Either may be None (null) for an op Core ML does not place, such as a
constant. An op with no outputs (``write_state``) carries ``inputs``, the names its argument bindings read
(``MLModelStructureProgramArgument.bindings[i].name``), by which it is joined. Ops in nested blocks (``cond``,
``while_loop``) are listed after their parent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from analyzer.measure.logs.rows import Collector, RejectError
from analyzer.measure.placement.plan_records import DEVICES, Device, PlacedOp, PlanLimits

FORMAT = "qfold-compute-plan"
SCHEMA_VERSION = 1
# coremltools' device classes (coremltools/models/compute_device.py) → qfold's device names.
DEVICE_CLASSES: Mapping[str, Device] = {"MLNeuralEngineComputeDevice": "ANE", "MLGPUComputeDevice": "GPU",
                                        "MLCPUComputeDevice": "CPU"}


def plan_document(package: str, compute_units: str, functions: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
                  made_with: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The document for ``functions`` = ``[(name, [op dict, …]), …]`` (op dicts as in the module docstring);
    raises ValueError for an op that would not read back."""
    out = []
    for name, ops in functions:
        checked = []
        for k, op in enumerate(ops):
            problem = _op_problem(op)
            if problem:
                raise ValueError(f"function {name!r}, op {k}: {problem}")
            entry = {"outputs": list(op["outputs"]), "type": op["type"], "preferred": op.get("preferred"),
                     "supported": list(op.get("supported") or []), "cost": op.get("cost")}
            if not op["outputs"]:  # joined by what it reads
                entry = {"outputs": [], "inputs": list(op["inputs"]), **{k: v for k, v in entry.items()
                                                                         if k != "outputs"}}
            checked.append(entry)
        out.append({"name": name, "ops": checked})
    return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "package": package, "compute_units": compute_units,
            "made_with": dict(made_with or {}), "functions": out}


def looks_like(doc: Any) -> bool:
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def _op_problem(op: Any) -> str | None:
    """Why an op entry is unusable, or None."""
    if not isinstance(op, Mapping):
        return "not an object"
    outputs = op.get("outputs")
    if not isinstance(outputs, list) or not all(isinstance(o, str) and o for o in outputs):
        return "'outputs' must be a list of output names"
    inputs = op.get("inputs", [])
    if not isinstance(inputs, list) or not all(isinstance(i, str) and i for i in inputs):
        return "'inputs' must be a list of input names"
    if not outputs and not inputs:
        return "an op with no outputs needs its 'inputs' (the names it reads) to be joined"
    if not isinstance(op.get("type"), str) or not op["type"].strip():
        return "'type' must be the op's type (a string)"
    preferred = op.get("preferred")
    if preferred is not None and preferred not in DEVICES:
        return f"'preferred' is {preferred!r}: one of {', '.join(DEVICES)} or null"
    supported = op.get("supported", [])
    if not isinstance(supported, list) or any(s not in DEVICES for s in supported):
        return f"'supported' must be a list of {', '.join(DEVICES)}"
    if preferred is not None and supported and preferred not in supported:
        return f"'preferred' {preferred} is not among 'supported' {supported}"
    cost = op.get("cost")
    if cost is not None:
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost):
            return f"'cost' is {cost!r}: a number from 0 to 1, or null"
        if not 0 <= cost <= 1:
            return f"'cost' is {cost}: Core ML's cost weight is a share of the work, from 0 to 1"
    return None


def read(doc: Any, col: Collector, limits: PlanLimits, lines: Sequence[int] = ()) -> tuple[list[PlacedOp], dict]:
    """The ops of a compute-plan document, each bad op refused on its own; the document's metadata.
    ``lines`` maps op records (in order) to the line their object starts on, when the text was pretty-printed."""
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RejectError(f"schema_version {version!r}: this qfold reads qfold-compute-plan version {SCHEMA_VERSION}",
                          column="schema_version")
    functions = doc.get("functions")
    if not isinstance(functions, list) or not functions:
        raise RejectError("'functions' must be a non-empty list of {name, ops}", column="functions")
    ops: list[PlacedOp] = []
    seen: set[str] = set()
    for f_index, f in enumerate(functions):
        name = f.get("name") if isinstance(f, dict) else None
        if not isinstance(name, str) or not name or not isinstance(f.get("ops"), list):
            raise RejectError(f"functions[{f_index}] must have a 'name' and a list of 'ops'", column="functions")
        if name in seen:
            raise RejectError(f"function {name!r} is listed twice", column="functions")
        seen.add(name)
        for k, op in enumerate(f["ops"]):
            record, line = json_record(col, limits, lines)
            if refused(col, record, line, f"functions[{f_index}].ops[{k}]", _op_problem(op)):
                continue
            ops.append(PlacedOp(name, tuple(op["outputs"]), op["type"].strip(), op.get("preferred"),
                                tuple(dict.fromkeys(op.get("supported") or [])), _cost(op.get("cost")), None,
                                line, record, tuple(op.get("inputs") or []) if not op["outputs"] else ()))
    meta = {"compute_units": doc.get("compute_units") if isinstance(doc.get("compute_units"), str) else None,
            "source": doc.get("package") if isinstance(doc.get("package"), str) else None,
            "functions": tuple(f["name"] for f in functions)}
    return ops, meta


def json_record(col: Collector, limits: PlanLimits, lines: Sequence[int]) -> tuple[int, int | None]:
    """The next op record of a JSON plan and the line its object starts on (None when lines are unknown)."""
    record = col.next_record()
    if record > limits.max_ops:
        raise RejectError(f"more than {limits.max_ops:,} ops (limit)")
    return record, lines[record - 1] if record - 1 < len(lines) else None


def refused(col: Collector, record: int, line: int | None, where: str, problem: str | None) -> bool:
    """Refuse the record (an error naming where it is in the document) when there is a problem."""
    if problem:
        col.add(line, where, None, "error", problem, record=record, shared_line=True)
    return problem is not None


def _cost(value: Any) -> float | None:
    return None if value is None else float(value)
