"""What a reader sees on a plotly chart's axes, checked from the figure's JSON (the spec the page sends the browser):

* each numeric axis's range contains the data drawn on it (markers, bars; a line without markers, such as a model
  curve or a roof, is a guide that may run past the view);
* no axis spans more than ``MAX_EXTRA_DECADES`` decades beyond its data;
* a log axis labels at least one tick per decade, each label reading its tick's value (``20``, not ``2``).

An axis with no ``range`` is ranged as plotly's autorange would: over the data, the annotations (on a log axis an
annotation's position is the log10 of its value, plotly's convention) and the shapes drawn in data coordinates.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass

import numpy as np

MAX_EXTRA_DECADES = 3.0
_DTYPES = {"f8": np.float64, "f4": np.float32, "i1": np.int8, "u1": np.uint8, "i2": np.int16, "u2": np.uint16,
           "i4": np.int32, "u4": np.uint32, "i8": np.int64, "u8": np.uint64}
_SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}


def values(v) -> list:
    """A plotly array as a list: plain JSON, or plotly 6's typed array ``{"dtype", "bdata"}``."""
    if v is None:
        return []
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=_DTYPES[v["dtype"]]).tolist()
    return list(v) if isinstance(v, list | tuple) else [v]


def _numbers(seq) -> list[float] | None:
    """The finite numbers of ``seq``; None when it holds text (a category axis)."""
    out = []
    for v in seq:
        if v is None:
            continue
        if isinstance(v, str):
            return None
        if isinstance(v, bool):
            continue
        f = float(v)
        if math.isfinite(f):
            out.append(f)
    return out


def _axis_name(ref: str, letter: str) -> str:
    """Trace/annotation ref (``x``, ``x2``) → layout key (``xaxis``, ``xaxis2``)."""
    return f"{letter}axis{ref[1:]}"


def _waterfall(trace: dict, along: str) -> list[float]:
    steps = _numbers(values(trace.get(along))) or []
    measures = values(trace.get("measure")) or ["relative"] * len(steps)
    total, out = 0.0, [0.0]
    for v, m in zip(steps, measures, strict=False):
        total = v if m == "absolute" else total if m == "total" else total + v
        out.append(total)
    return out


@dataclass
class AxisData:
    kind: str  # "log", "linear", "category"
    data: list[float]
    marks: list[float]  # annotations, shapes and guide lines in data units (they widen an autorange)


def axis_data(spec: dict) -> dict[str, AxisData]:
    """Every axis a trace draws on, with the numbers drawn on it."""
    layout = spec.get("layout", {})
    out: dict[str, AxisData] = {}

    def axis(name: str) -> AxisData:
        if name not in out:
            kind = (layout.get(name) or {}).get("type") or "-"
            out[name] = AxisData(kind, [], [])
        return out[name]

    for trace in spec.get("data", []):
        kind = trace.get("type", "scatter")
        if kind not in ("scatter", "scattergl", "bar", "waterfall"):
            continue
        horizontal = trace.get("orientation") == "h"
        for letter in "xy":
            a = axis(_axis_name(trace.get(f"{letter}axis", letter), letter))
            value_axis = (letter == "x") == horizontal
            if kind == "waterfall" and value_axis:
                nums = _waterfall(trace, letter)
            else:
                nums = _numbers(values(trace.get(letter)))
                if nums is not None and kind == "bar" and value_axis and a.kind != "log":
                    nums = [*nums, 0.0]  # a bar is drawn from zero
            if nums is None:
                a.kind = "category" if a.kind == "-" else a.kind
                continue
            guide = kind.startswith("scatter") and "markers" not in str(trace.get("mode", "markers")) and \
                "text" not in str(trace.get("mode", ""))
            (a.marks if guide else a.data).extend(nums)
    for ann in layout.get("annotations", []) or []:
        for letter in "xy":
            ref = ann.get(f"{letter}ref", letter)
            if ref in (None, "paper") or "domain" in str(ref) or ref not in _refs(out, letter):
                continue
            a, v = out[_axis_name(ref, letter)], ann.get(letter)
            if isinstance(v, int | float):
                a.marks.append(10 ** v if a.kind == "log" and v < 308 else math.inf if a.kind == "log" else float(v))
    for shape in layout.get("shapes", []) or []:
        for letter in "xy":
            ref = shape.get(f"{letter}ref", letter)
            if ref in (None, "paper") or "domain" in str(ref) or ref not in _refs(out, letter):
                continue
            a = out[_axis_name(ref, letter)]
            ends = (shape.get(f"{letter}0"), shape.get(f"{letter}1"))
            a.marks.extend(float(v) for v in ends if isinstance(v, int | float))
    return out


def _refs(axes: dict[str, AxisData], letter: str) -> set[str]:
    return {letter + name[len(letter) + 4:] for name in axes if name.startswith(f"{letter}axis")}


def parse_tick(text: str) -> float | None:
    """``1,000`` → 1000, ``20k`` → 20000, ``0.5`` → 0.5, ``1T`` → 1e12; None if it is not a number."""
    m = re.fullmatch(r"\s*([0-9][0-9,]*(?:\.[0-9]+)?)\s*([kMGTPE]?)\s*", re.sub(r"<[^>]*>", "", str(text)))
    return None if m is None else float(m.group(1).replace(",", "")) * _SI[m.group(2)]


def axis_problems(spec: dict | str, where: str = "") -> list[str]:
    """What is wrong with each numeric axis of a plotly figure spec, one line each."""
    if isinstance(spec, str):
        spec = json.loads(spec)
    layout = spec.get("layout", {})
    problems = []
    for name, a in sorted(axis_data(spec).items()):
        box = layout.get(name) or {}
        kind = box.get("type") or ("category" if a.kind == "category" else "linear")
        label = f"{where}: {name} ({kind}, {_title(box)!r})"
        if kind in ("category", "multicategory", "date") or not a.data:
            continue
        log = kind == "log"
        data = [v for v in a.data if v > 0] if log else a.data
        if not data:
            problems.append(f"{label}: no positive value on a log axis")
            continue
        conv = (lambda v: math.log10(v) if v > 0 else -math.inf) if log else float
        d_lo, d_hi = conv(min(data)), conv(max(data))
        rng = box.get("range")
        if rng is not None and box.get("autorange") not in (True, "reversed") and None not in rng:
            lo, hi = sorted(float(r) for r in rng)
        else:
            marks = [conv(m) for m in a.marks if not log or m > 0]
            lo, hi = min([d_lo, *marks]), max([d_hi, *marks])
        tol = 1e-9 * max(1.0, abs(d_lo), abs(d_hi))
        if d_lo < lo - tol or d_hi > hi + tol:
            problems.append(f"{label}: range [{_show(lo, log)}, {_show(hi, log)}] leaves out data "
                            f"[{_show(d_lo, log)}, {_show(d_hi, log)}]")
        if log:
            extra = (hi - lo) - (d_hi - d_lo)
        else:
            width, d_width = hi - lo, max(d_hi - d_lo, abs(d_hi), abs(d_lo), 1e-300)
            extra = math.log10(width / d_width) if width > 0 else 0.0
        if extra > MAX_EXTRA_DECADES:
            problems.append(f"{label}: spans {extra:.1f} decades beyond its data "
                            f"([{_show(lo, log)}, {_show(hi, log)}] for [{_show(d_lo, log)}, {_show(d_hi, log)}])")
        if log:
            problems.extend(f"{label}: {p}" for p in _log_tick_problems(box, lo, hi))
    return problems


def _log_tick_problems(box: dict, lo: float, hi: float) -> list[str]:
    vals = values(box.get("tickvals"))
    texts = values(box.get("ticktext"))
    if not vals:
        return ["no tick values of its own: plotly's automatic log ticks label digits (`2`, `5`) or skip decades"]
    shown = sorted(math.log10(v) for v in vals if v > 0 and lo <= math.log10(v) <= hi)
    problems = []
    if not shown:
        return [f"no tick inside its range [{_show(lo, True)}, {_show(hi, True)}]"]
    gaps = [b - a for a, b in zip([lo, *shown], [*shown, hi], strict=True)]
    if max(gaps) > 1.0 + 1e-9:
        problems.append(f"a decade without a tick label (ticks {[_show(s, True) for s in shown]} in "
                        f"[{_show(lo, True)}, {_show(hi, True)}])")
    if texts:
        for v, t in zip(vals, texts, strict=False):
            parsed = parse_tick(t)
            if parsed is None or not math.isclose(parsed, float(v), rel_tol=1e-6):
                problems.append(f"tick {float(v):g} is labelled {t!r}")
    return problems


def _title(box: dict) -> str:
    t = box.get("title")
    return (t.get("text") if isinstance(t, dict) else t) or ""


def _show(v: float, log: bool) -> str:
    return f"10^{v:.2f}" if log and math.isfinite(v) else f"{v:.4g}"
