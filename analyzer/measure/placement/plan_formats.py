"""Placement plans by content, never by file name: bytes → :class:`PlacementPlan`, bad content as issues.

Gate 1 is the device logs' (size, strict UTF-8, no control characters; :mod:`analyzer.measure.logs.text`); then the
format (the registry below, most specific evidence first) and its reader, which refuses a bad record at its line
and keeps the rest. A file-level problem (not UTF-8, not a plan, a wrong schema version) refuses the file with one
issue.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import analyzer.measure.placement.anemll_profile as anemll_profile  # modules, not the package: no import circle
import analyzer.measure.placement.bench_profile as bench_profile
import analyzer.measure.placement.coreai_inspect as coreai_inspect
import analyzer.measure.placement.plan_dumps as plan_dumps
import analyzer.measure.placement.plan_json as plan_json
from analyzer.errors import QfoldError
from analyzer.fsio import loads_strict
from analyzer.measure.logs import LogIssue, LogLimits
from analyzer.measure.logs.rows import Collector, RejectError, preview
from analyzer.measure.logs.text import LineCounter, decode, file_label
from analyzer.measure.placement.plan_records import DEFAULT_PLAN_LIMITS, PlacementPlan, PlanLimits


@dataclass(frozen=True, slots=True)
class PlanFormatSpec:
    name: str
    description: str
    detect: Callable[[str], bool]


_SPECS = (
    PlanFormatSpec("qfold-compute-plan", "qfold's compute-plan JSON (scripts/macos/profile_coreml.py: "
                   "MLComputePlan per op: outputs, type, preferred and supported devices, cost)",
                   lambda text: text.lstrip().startswith("{") and f'"{plan_json.FORMAT}"' in text[:4096]),
    PlanFormatSpec("qfold-bench-profile", "qfold bench --profile-out (the Core AI runtime's profiler: per op, time "
                   "per decode token)", lambda text: text.lstrip().startswith("{") and '"targets"' in text
                   and '"time_ms"' in text and '"machine"' in text),
    PlanFormatSpec("coreai-build-inspect", "xcrun coreai-build inspect ASSET --ops --json (a Core AI asset's "
                   "summary: ops per operation name, functions, states, inputs and outputs; no placement)",
                   coreai_inspect.detect),
    PlanFormatSpec("anemll-profile", "anemll-profile's report (Op-Type Runtime Breakdown, Measured, CPU/GPU "
                   "Fallback Ops)", anemll_profile.detect),
    PlanFormatSpec("coremlinspect", "CoreMLInspect's dump ('0.17% G|CN var_145 = ios16.mul(…)')",
                   plan_dumps.inspect_detect),
    PlanFormatSpec("coreml-profiling-nslog", "coreml_profiling's NSLog lines ('operation ios17.conv, device "
                   "<MLNeuralEngineComputeDevice: 0x…>, cost 4.5811%')", plan_dumps.nslog_detect),
)
FORMATS: Mapping[str, PlanFormatSpec] = MappingProxyType({s.name: s for s in _SPECS})


def plan_format(text: str) -> str | None:
    """The plan format of ``text``, or None when it is not a placement plan (it may be a device log)."""
    return next((s.name for s in _SPECS if s.detect(text)), None)


def is_plan(data: bytes) -> bool:
    """Whether an upload reads as a placement plan (the Device logs page routes it here instead of the log
    importer), judged on its first MiB; bytes that are not text are no plan, and the log importer says why."""
    return plan_format(data[: 1 << 20].decode("utf-8", errors="ignore")) is not None


def parse_plan(data: bytes, name: str, limits: PlanLimits = DEFAULT_PLAN_LIMITS) -> PlacementPlan:
    """One upload or file as a placement plan. Never raises for bad content: a refused file comes back with
    ``accepted`` False and the reason in ``issues``; bad records are refused one by one."""
    col = Collector(file_label(name))
    fmt: str | None = None
    try:
        text = decode(data, LogLimits(max_file_bytes=limits.max_file_bytes), col)
        fmt = plan_format(text)
        if fmt is None:
            raise RejectError("not a placement plan: expected qfold's compute-plan JSON, a qfold bench profile "
                              "(bench --profile-out), coreai-build inspect --ops --json, anemll-profile's report, "
                              "CoreMLInspect's dump or coreml_profiling's 'operation …, device …, cost …' lines")
        plan = _read(fmt, text, col, limits)
    except RejectError as e:
        issue = LogIssue(col.file_name, e.line, e.column, preview(e.value), "error", e.message)
        return PlacementPlan(col.file_name, fmt, False, n_records=col.n_records, issues=(issue,))
    issues = sorted(col.issues, key=lambda i: (i.line is not None, i.line or 0, i.record or 0))
    return PlacementPlan(**{**plan, "file_name": col.file_name, "format": fmt, "accepted": True,
                            "n_records": col.n_records, "issues": tuple(issues)})


def _read(fmt: str, text: str, col: Collector, limits: PlanLimits) -> dict:
    if fmt == "qfold-compute-plan":
        doc = _json(text, col)
        if not plan_json.looks_like(doc):
            raise RejectError(f"a JSON document without \"format\": \"{plan_json.FORMAT}\"")
        lines = _key_lines(text, "outputs")
        n_ops = sum(len(f["ops"]) for f in doc.get("functions") or [] if isinstance(f, dict) and
                    isinstance(f.get("ops"), list))
        ops, meta = plan_json.read(doc, col, limits, lines if len(lines) == n_ops else ())
        return {"ops": tuple(ops), "functions": meta["functions"], "compute_units": meta["compute_units"],
                "source": meta["source"]}
    if fmt == "qfold-bench-profile":
        doc = _json(text, col)
        if not bench_profile.looks_like(doc):
            raise RejectError("a JSON document with 'machine' and 'targets' but not a bench profile's (each "
                              "target has 'ops')")
        ops, meta = bench_profile.read(doc, col, limits, _key_lines(text, "time_ms"))
        return {"ops": tuple(ops), **meta,
                "notes": ("a bench profile: every op ran on the CPU (the Core AI runtime here), timed by its "
                          "profiler",)}
    if fmt == "coreai-build-inspect":
        doc = _json(text, col)
        if not coreai_inspect.looks_like(doc):
            raise RejectError(f"a JSON document whose {coreai_inspect.KEY!r} is not a list of operation counts")
        meta = coreai_inspect.read(doc, col, limits, _key_lines(text, "operationName"))
        return {**meta, "coverage": "op_counts",
                "notes": ("coreai-build inspect counts ops per operation name and places none on a compute unit (no "
                          "Core AI API says where an op ran): nothing is joined per op, and no segments are given",)}
    if fmt == "anemll-profile":
        ops, meta = anemll_profile.read(text, col, limits)
        return {"ops": tuple(ops), "coverage": "off_ane_only", "compute_units": meta["compute_units"],
                "source": meta["source"], "op_type_times": meta["op_type_times"], "timing": meta["timing"],
                "notes": ("anemll-profile lists only the ops not on the Neural Engine (of every function, unnamed): "
                          "the analysis's other compute ops are counted on the Neural Engine",)}
    if fmt == "coremlinspect":
        ops = plan_dumps.inspect_read(text, col, limits)
        return {"ops": tuple(ops), "functions": tuple(dict.fromkeys(op.function for op in ops)),
                "notes": ("CoreMLInspect's costs are shares of each block's total weight",)}
    ops = plan_dumps.nslog_read(text, col, limits)
    return {"ops": tuple(ops), "functions": ("main",), "matching": "by_order",
            "notes": ("coreml_profiling prints no output names: its ops are aligned with the analysis by program "
                      "order and op type, and it prints only main's ops that have a cost and a device",)}


def _json(text: str, col: Collector):
    try:
        return loads_strict(text, col.file_name)
    except json.JSONDecodeError as e:
        raise RejectError(f"not valid JSON ({e.msg})", line=e.lineno) from None
    except QfoldError as e:
        raise RejectError(str(e)) from None


def _key_lines(text: str, key: str) -> list[int]:
    """The line of every ``"key":`` in the text: one per op object when pretty-printed (a minified document has
    them all on line 1, still right)."""
    line_of = LineCounter(text)
    return [line_of(m.start()) for m in re.finditer(rf'"{key}"\s*:', text)]
