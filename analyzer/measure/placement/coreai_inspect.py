"""``xcrun coreai-build inspect ASSET --ops --json``: a Core AI asset's summary, as the tool prints it.

No output of the command is published (searched 2026-12-05: code, issues, pages; the community notes that run it
print only its op counts). It is read by its documented format, the ``Codable`` summary Core AI returns for an
asset (developer.apple.com/documentation/coreai/aimodelasset/summary, read 2026-12-05)::

    AIModelAsset.Summary
      functions              [FunctionDescriptor]  name; inputs, outputs, states: [ValueDescriptor] (name, typeName)
      computeTypes           [String]              the unique compute type names (precisions, not compute units)
      storageTypes           [StorageType]         the unique scalar storage types and their element counts
      operationDistribution  [OperationCount]      operationName, count: "the number of times this operation
                                                   occurs in the model"

with the JSON keys named as those properties (an assumption until a real output is seen). What this gives and
what it does not:

- **ops per operation name, per compute unit: not given.** The distribution counts ops by name only; no field
  places an op or a count on the Neural Engine, GPU or CPU (Apple, developer forums thread 831967: "There is not
  currently a runtime API available to dynamically tell which operations are running on the neural engine"). The
  join compares the counts with the analysis's op types and places nothing (``coverage`` ``op_counts``).
- **ops by name: not given**, so nothing is joined per op.
- **segments** (the Neural Engine / GPU regions the compiler cut the graph into; "If an op cannot run on Neural
  Engine, the compiler segments the graph", apple/coreai-models ``skills/.../neural_engine_rules.md``): not in the
  summary; None, and the join says so.
- states and inputs/outputs per function: read and listed.
"""

from __future__ import annotations

from typing import Any

from analyzer.measure.logs.rows import Collector, RejectError
from analyzer.measure.placement.plan_records import PlanLimits

KEY = "operationDistribution"


def detect(text: str) -> bool:
    return text.lstrip().startswith("{") and f'"{KEY}"' in text


def looks_like(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get(KEY), list)


def _values(fn: dict, key: str, where: str) -> tuple[tuple[str, str], ...]:
    values = fn.get(key, [])
    if not isinstance(values, list) or not all(isinstance(v, dict) and isinstance(v.get("name"), str)
                                               for v in values):
        raise RejectError(f"{where}.{key} must be a list of {{name, typeName}}", column=f"{where}.{key}")
    return tuple((v["name"], str(v.get("typeName", ""))) for v in values)


def read(doc: dict, col: Collector, limits: PlanLimits, lines: list[int]) -> dict[str, Any]:
    """The summary's op counts (a bad entry refused at its line, the rest kept), functions, states and IO."""
    counts: dict[str, int] = {}
    for k, entry in enumerate(doc[KEY]):
        record = col.next_record()
        if record > limits.max_ops:
            raise RejectError(f"more than {limits.max_ops:,} operation counts (limit)")
        line = lines[k] if k < len(lines) else None
        name = entry.get("operationName") if isinstance(entry, dict) else None
        count = entry.get("count") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or isinstance(count, bool) or not isinstance(count, int) \
                or count < 0:
            col.add(line, f"{KEY}[{k}]", None, "error", "an operation count is {operationName: text, count: a "
                    "whole number >= 0}", record=record)
            continue
        if name in counts:
            col.add(line, f"{KEY}[{k}]", name, "error", f"{name!r} is counted twice", record=record)
            continue
        counts[name] = count
    functions = doc.get("functions", [])
    if not isinstance(functions, list) or not all(isinstance(f, dict) for f in functions):
        raise RejectError("functions must be a list of function descriptors", column="functions")
    signatures = []
    for i, fn in enumerate(functions):
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            raise RejectError(f"functions[{i}] has no name", column=f"functions[{i}].name")
        signatures.append((name, *(_values(fn, key, f"functions[{i}]") for key in ("inputs", "outputs", "states"))))
    compute = doc.get("computeTypes", [])
    return {"op_counts": tuple(sorted(counts.items())), "functions": tuple(s[0] for s in signatures),
            "signatures": tuple(signatures),
            "compute_types": tuple(c for c in compute if isinstance(c, str)) if isinstance(compute, list) else ()}
