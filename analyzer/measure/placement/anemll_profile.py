"""anemll-profile's report (Anemll/anemll-profile ``anemll_profile.m`` @ 821c3019f529, its ``printf`` calls)::

      ANE CostModel Report: model.mlmodelc
      Compute:      CPU+ANE
      Total ops:    1234
      ANE ops:      1100 (97.1% of cost)
      ...
      Op-Type Runtime Breakdown
      Op Type                          Count      ms/op   Total ms    GFLOP     GB/s  Share Bound
      conv                                96   0.051234      4.918   1.2345    61.20  70.1% Mem
      ...
      Measured:  7.512 ms/prediction  (133.1 iter/s, 10 runs)
      Weight BW: 61.27 GB/s  (460.3 MB weights streamed/iter)
      ...
      CPU/GPU Fallback Ops (3 ops not on ANE)
      Output Name                              Op Type                   Dev Supported    Reason
      var_1234_cast_fp16                       slice_update              CPU CPU          ane: Cannot support …

Format strings: the op-type rows ``"  %-32s %5d %10.6f %10.3f %8.4f %8.2f %5.1f%% %s"`` (type without its
``iosNN.`` prefix, count, ms per op, total ms, GFLOP, GB/s, share of the summed time, ``Comp``/``Mem``/``?``),
``"  Measured:  %.3f ms/prediction  (%.1f iter/s, %d runs)"``, ``"  Weight BW: %.2f GB/s  (%.1f MB weights
streamed/iter)"`` and the fallback rows ``"  %-40s %-24s %4s %-12s %s"`` (the first output's name, cut to its last
38 characters after ``..`` when longer than 40; the type; the preferred device; the supported ones joined by
``,``; the reason: ``ane: `` + the ANE compiler's messages for that op type, else "ANE supported but not
preferred" or "Not supported on ANE", cut the same way at 80). The fallback table lists only the ops *not* on the
Neural Engine, of every function without naming it; the op-type times are the Espresso cost model's estimates.

Two tables name ops with their cost, read per op (``table`` says which):

- "Top N Most Expensive Operations" (N = min(20, the cost model's unique ops)): ``"  %-44s %-24s %10.6f %8.2f %8.2f
  %s"``: the op's name cut by ``truncName(…, 44)`` (its last 42 characters after ``..`` when longer than 44), its
  type without ``iosNN.``, the cost model's ms, MB (``totalMB``), GB/s (MB ÷ ms: so MB = 10^6 bytes and GB = 10^9)
  and bound (``Memory``, ``Compute``, or ``?`` when the log gave none: kept as None);
- "Conv Detail (top 15)": ``"  %-40s %10.6f %8.2f %8.2f %8.2f %6d %6d %6.1f%%"``: the full name (never cut), ms,
  GFLOP/s, MB, GB/s, input and output channels, work-unit efficiency; of ops whose type contains ``conv``.

Both come from the ANE compiler's ``[CostModelFeature]`` log lines, so an op they name was planned on the Neural
Engine (device ``ANE``) unless the fallback table puts it elsewhere. The "MLComputePlan High-Cost Ops" table names
ops by index only and is not read.
"""

from __future__ import annotations

import re

from analyzer.measure.logs.cells import NUMBER
from analyzer.measure.logs.rows import Collector, RejectError
from analyzer.measure.placement.plan_records import DEVICES, OpTypeTime, PlacedOp, PlanLimits, PlanTiming

_REPORT = re.compile(r"^\s*ANE CostModel Report: (?P<name>.+?)\s*$")
_COMPUTE = re.compile(r"^\s*Compute:\s+(?P<units>CPU\+ANE|All \(CPU\+GPU\+ANE\))\s*$")
_MEASURED_ANY = re.compile(r"^\s*Measured:")
_MEASURED = re.compile(rf"^\s*Measured:\s+(?P<ms>{NUMBER}) ms/prediction\s+\((?P<ips>{NUMBER}) iter/s, "
                       r"(?P<runs>\d+) runs\)\s*$")
_WEIGHT_BW_ANY = re.compile(r"^\s*Weight BW:")
_WEIGHT_BW = re.compile(rf"^\s*Weight BW:\s+(?P<gbs>{NUMBER}) GB/s\b")
_TYPE_HEADER = re.compile(r"^\s*Op Type\s+Count\s+ms/op\s+Total ms\s+GFLOP\s+GB/s\s+Share\s+Bound\s*$")
_FALLBACK_HEADER = re.compile(r"^\s*Output Name\s+Op Type\s+Dev\s+Supported\s+Reason\s*$")
_TOP_HEADER = re.compile(r"^\s*Op Name\s+Type\s+ms\s+MB\s+GB/s\s+Bound\s*$")
_CONV_HEADER = re.compile(r"^\s*Name\s+ms\s+GFLOP/s\s+MB\s+GB/s\s+InCh\s+OutCh\s+WU%\s*$")
MB = 10**6  # anemll-profile's MB: GB/s is printed as MB ÷ ms
_RULE = re.compile(r"^[\s─═]+$")
_SUPPORTED = re.compile(r"^(?:ANE|CPU|GPU)(?:,(?:ANE|CPU|GPU))*$")
UNITS = {"CPU+ANE": "CPU_AND_NE", "All (CPU+GPU+ANE)": "ALL"}


def detect(text: str) -> bool:
    return any(_REPORT.match(line) or _FALLBACK_HEADER.match(line) or _TOP_HEADER.match(line)
               for line in text.splitlines())


def read(text: str, col: Collector, limits: PlanLimits) -> tuple[list[PlacedOp], dict]:
    ops: list[PlacedOp] = []
    times: list[OpTypeTime] = []
    meta: dict = {"compute_units": None, "source": None, "timing": None}
    section: str | None = None
    measured: tuple[float, float, int, int] | None = None
    weight_bw: float | None = None
    for line, raw in enumerate(text.splitlines(), start=1):
        if m := _REPORT.match(raw):
            meta["source"] = m["name"]
        elif m := _COMPUTE.match(raw):
            meta["compute_units"] = UNITS[m["units"]]
        elif _TYPE_HEADER.match(raw):
            section = "types"
        elif _FALLBACK_HEADER.match(raw):
            section = "fallback"
        elif _TOP_HEADER.match(raw):
            section = "top_ops"
        elif _CONV_HEADER.match(raw):
            section = "conv_detail"
        elif _MEASURED_ANY.match(raw):
            m = _MEASURED.match(raw)
            if m is None:
                col.add(line, "Measured", raw.strip(), "warning", "not 'Measured: T ms/prediction (X iter/s, N "
                        "runs)'; the timing is not used")
            else:
                measured = (float(m["ms"]), float(m["ips"]), int(m["runs"]), line)
        elif _WEIGHT_BW_ANY.match(raw):
            m = _WEIGHT_BW.match(raw)
            if m is None:
                col.add(line, "Weight BW", raw.strip(), "warning", "not 'Weight BW: X GB/s (…)'; the weight bandwidth "
                        "is not used")
            else:
                weight_bw = float(m["gbs"]) * 1e9
        elif not raw.strip() or raw.strip().startswith("═") or "TOTAL (sum, sequential)" in raw:
            section = None  # a table's rows follow its header and rule, and end at a blank line
        elif _RULE.match(raw):
            continue
        elif section == "types":
            row = _type_row(raw, line, col, limits)
            if row is not None:
                times.append(row)
        elif section in ("fallback", "top_ops", "conv_detail"):
            row = {"fallback": _fallback_row, "top_ops": _top_row, "conv_detail": _conv_row}[section]
            op = row(raw, line, col, limits)
            if op is not None:
                ops.append(op)
    if measured is not None:
        meta["timing"] = PlanTiming(measured[0], measured[1], measured[2], weight_bw, measured[3])
    meta["op_type_times"] = tuple(times)
    return ops, meta


def _next(col: Collector, line: int, limits: PlanLimits) -> int:
    record = col.next_record()
    if record > limits.max_ops:
        raise RejectError(f"more than {limits.max_ops:,} rows (limit)", line=line)
    return record


def _type_row(raw: str, line: int, col: Collector, limits: PlanLimits) -> OpTypeTime | None:
    record = _next(col, line, limits)
    parts = raw.split()
    if len(parts) != 8 or not parts[6].endswith("%"):
        col.add(line, None, raw.strip(), "error", "an op-type row has 8 fields: type, count, ms/op, total ms, GFLOP, "
                "GB/s, share%, bound", record=record)
        return None
    try:
        count = int(parts[1])
        numbers = [float(p) for p in (parts[2], parts[3], parts[4], parts[5], parts[6][:-1])]
    except ValueError:
        col.add(line, None, raw.strip(), "error", "count, ms/op, total ms, GFLOP, GB/s and share must be numbers",
                record=record)
        return None
    if count < 1 or any(not (0 <= v < float("inf")) for v in numbers):
        col.add(line, None, raw.strip(), "error", "counts and times must be positive and finite", record=record)
        return None
    return OpTypeTime(parts[0], count, numbers[0], numbers[1], numbers[2], numbers[3], numbers[4], parts[7], line)


def _fallback_row(raw: str, line: int, col: Collector, limits: PlanLimits) -> PlacedOp | None:
    record = _next(col, line, limits)
    parts = raw.split()
    if len(parts) < 3:
        col.add(line, None, raw.strip(), "error", "a fallback row is: output name, op type, device, supported "
                "devices, reason", record=record)
        return None
    name, op_type, device = parts[0], parts[1], parts[2]
    if device not in DEVICES:
        col.add(line, "Dev", device, "error", f"device must be one of {', '.join(DEVICES)}", record=record)
        return None
    rest = parts[3:]
    supported: tuple = ()
    if rest and _SUPPORTED.match(rest[0]):
        supported = tuple(dict.fromkeys(rest[0].split(",")))
        rest = rest[1:]
    reason = " ".join(rest) or None
    return PlacedOp("", (name,), op_type, device, supported, None, reason, line, record,  # type: ignore[arg-type]
                    table="fallback")


def _numbers(texts: list[str]) -> list[float] | None:
    try:
        values = [float(t) for t in texts]
    except ValueError:
        return None
    return values if all(0 <= v < float("inf") for v in values) else None


def _top_row(raw: str, line: int, col: Collector, limits: PlanLimits) -> PlacedOp | None:
    record = _next(col, line, limits)
    parts = raw.split()
    if len(parts) != 6:
        col.add(line, None, raw.strip(), "error", "a Top-N row has 6 fields: op name, type, ms, MB, GB/s, bound",
                record=record)
        return None
    numbers = _numbers(parts[2:5])
    if numbers is None:
        col.add(line, None, raw.strip(), "error", "ms, MB and GB/s must be finite numbers >= 0", record=record)
        return None
    ms, mb, gbs = numbers
    bound = None if parts[5] == "?" else parts[5]
    return PlacedOp("", (parts[0],), parts[1], "ANE", (), None, None, line, record, table="top_ops",
                    estimate_ms=ms, moved_bytes=round(mb * MB), bytes_per_s=gbs * 1e9, bound=bound)


def _conv_row(raw: str, line: int, col: Collector, limits: PlanLimits) -> PlacedOp | None:
    record = _next(col, line, limits)
    parts = raw.split()
    if len(parts) != 8 or not parts[7].endswith("%"):
        col.add(line, None, raw.strip(), "error", "a Conv Detail row has 8 fields: name, ms, GFLOP/s, MB, GB/s, "
                "InCh, OutCh, WU%", record=record)
        return None
    numbers = _numbers([parts[1], parts[3], parts[4]])
    if numbers is None:
        col.add(line, None, raw.strip(), "error", "ms, MB and GB/s must be finite numbers >= 0", record=record)
        return None
    ms, mb, gbs = numbers
    return PlacedOp("", (parts[0],), "conv", "ANE", (), None, None, line, record, table="conv_detail",
                    estimate_ms=ms, moved_bytes=round(mb * MB), bytes_per_s=gbs * 1e9)
