"""Pure frame transforms for display: units beside exact bytes, GFLOP, the cross-check in MB, the styler
every table goes through, and CSV of any frame. No Streamlit: the pages draw what these return."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from dataclasses import fields
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from analyzer import fmt
from analyzer.analysis.record import Analysis
from analyzer.fmt import MB, MIB, to_csv


def frame_csv(frame: pd.DataFrame) -> str:
    """A frame as CSV through ``fmt.to_csv`` (formula-like cells escaped; missing values empty)."""
    clean = frame.astype(object).where(frame.notna(), None)
    return to_csv(clean.to_dict("records"), [str(c) for c in frame.columns])


def records_frame(records: Sequence[Any], **extra: Callable[[Any], Any]) -> pd.DataFrame:
    """Frozen dataclass records as a frame, one column per field (and per ``extra`` name: a function of the record),
    a field typed ``int | None`` kept as integers (pandas' nullable ``Int64``: ``128``, never ``128.00``)."""
    records = list(records)
    if not records:
        return pd.DataFrame()
    names = [f.name for f in fields(records[0])]
    frame = pd.DataFrame([{**{n: getattr(r, n) for n in names}, **{k: f(r) for k, f in extra.items()}}
                          for r in records])
    for f in fields(records[0]):
        if str(f.type).replace(" ", "") in ("int|None", "Optional[int]", "int"):
            frame[f.name] = frame[f.name].astype("Int64")
    return frame


def with_units(frame: pd.DataFrame, byte_columns: Sequence[str], mb: bool = False) -> pd.DataFrame:
    """Add ``<col> MiB`` (and ``<col> MB``) beside byte columns, for display only."""
    out = frame.copy()
    for col in byte_columns:
        pos = out.columns.get_loc(col) + 1
        values = pd.to_numeric(out[col], errors="coerce").astype("float64")
        if mb:
            out.insert(pos, f"{col} MB", values / MB)
        out.insert(pos, f"{col} MiB", values / MIB)
    return out


def category_display(frame: pd.DataFrame) -> pd.DataFrame:
    """``figures.category_frame`` in the binary and the decimal unit its largest value reads best in (≥ 100 of
    it: MiB for a full-size model, KiB for a tiny one), for the headline (the CSV keeps the exact bytes)."""
    out = pd.DataFrame({"category": frame["category"]})
    largest = max(frame[["a_bytes", "b_bytes", "delta_bytes"]].abs().max().max(), 1)
    for ladder in ("auto", "auto-si"):
        unit = fmt.pick_unit(largest, ladder, at_least=100)
        for side, col in (("A", "a_bytes"), ("B", "b_bytes"), ("Δ", "delta_bytes")):
            out[f"{side} {unit}"] = frame[col].astype("float64") / fmt.UNITS[unit]
    return out


def flops_display(frame: pd.DataFrame) -> pd.DataFrame:
    """``figures.flops_frame`` in GFLOP (10^9 FLOPs), for the screen (the CSV keeps the exact counts)."""
    out = pd.DataFrame({"category": frame["category"]})
    for side, col in (("A", "a_flops"), ("B", "b_flops"), ("Δ", "delta_flops"), ("A per call", "a_flops_per_call"),
                      ("B per call", "b_flops_per_call")):
        out[f"{side} GFLOP"] = frame[col].astype("float64") / 1e9
    return out


def crosscheck_display(frame: pd.DataFrame) -> pd.DataFrame:
    """``figures.bandwidth_frame`` with bytes in MB, for the page (the CSV keeps the exact bytes)."""
    def num(col: str, scale: float = 1.0) -> pd.Series:
        return pd.to_numeric(frame[col], errors="coerce").astype("float64") / scale

    return pd.DataFrame({
        "build": frame["build"], "device": frame["device"], "n": frame["n"],
        "measured tok/s": num("measured_tok_per_s"), "predicted tok/s": num("predicted_tok_per_s"),
        "residual %": num("residual_pct"), "graph MB": num("graph_bytes_per_token", MB),
        "inferred MB": num("inferred_bytes_per_token", MB), "gap MB": num("gap_bytes", MB), "gap %": num("gap_pct"),
        "BW MB/s": num("bw_bytes_per_s", MB),
    })


def tile_sizes_text(analysis: Analysis) -> str:
    """``60 tiles × 16 MiB = 960 MiB`` when the tiles are all one size."""
    tiles = analysis.summary.tiles
    sizes = {t.output_bytes or 0 for t in tiles}
    total = analysis.summary.tile_output_bytes
    if len(sizes) == 1:
        return f"A: {len(tiles)} tiles × {fmt.mib(sizes.pop(), 2)} = {fmt.mib(total, 0)} of tile output"
    return f"A: {len(tiles)} tiles, {fmt.mib(total, 0)} of tile output"


def fit_height(n_rows: int, max_px: int = 420) -> int:
    """A table height that shows every row up to ``max_px`` (no empty rows under a short table)."""
    return min(max_px, 38 + 35 * max(n_rows, 1))


# st.metric's value font (2.25rem = 36 px, Source Sans): widths of its glyphs, measured in chromium at 1400 px
# ("2,521 → 2,401" is 197 px wide); unknown glyphs count as a lowercase letter.
_GLYPH_PX = {**dict.fromkeys("0123456789", 17), **dict.fromkeys(".,: ", 8), "→": 32, "×": 18,
             **dict.fromkeys("ilj|", 8), **dict.fromkeys("ABCDEFGHJKLNOPQRSTUVXYZ", 22), "M": 26, "W": 30}


METRIC_PADDING_PX = 40  # the bordered card's padding on both sides, plus slack


def metric_width_px(values: Sequence[str], minimum: int = 220) -> int:
    """One width for a row of metric cards that shows the longest value whole (cards wrap instead of cutting)."""
    widest = max((sum(_GLYPH_PX.get(c, 16) for c in v) for v in values), default=0)
    return max(minimum, widest + METRIC_PADDING_PX)


MAX_STYLED_CELLS = 200_000  # under pandas' styler.render.max_elements (262,144), which Streamlit enforces


ONE_DECIMAL_SUFFIXES = (" KiB", " MiB", " GiB", " MB", " GB", " kB", " %", "MB/s")


def _blank(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


def _number_text(value: Any, digits: int) -> str:
    """``1,234``, ``12.5``, never ``-0.0``; missing → blank."""
    if _blank(value):
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(value)
    if digits == 0 or isinstance(value, numbers.Integral):
        return f"{int(value):,}"
    return f"{round(float(value), digits) + 0.0:,.{digits}f}"


def _cell_text(value: Any) -> str:
    if _blank(value):
        return ""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return _number_text(value, 0 if isinstance(value, numbers.Integral) else 2)
    return str(value)


def styled(frame: pd.DataFrame) -> Any:
    """``frame`` as the pages show it: thousands separators, one decimal for MiB/MB/% columns and two otherwise,
    no ``-0.0``, and empty optional cells blank rather than "None" (a pandas Styler: Streamlit shows its display
    values and sorts by the numbers). Frames too large to style are returned as they are."""
    if frame.size > MAX_STYLED_CELLS or frame.empty:
        return frame
    formats: dict[Any, Callable[[Any], str]] = {}
    for col in frame.columns:
        dtype = frame[col].dtype
        if pd.api.types.is_bool_dtype(dtype):
            continue
        if pd.api.types.is_integer_dtype(dtype):
            formats[col] = partial(_number_text, digits=0)
        elif pd.api.types.is_float_dtype(dtype):
            formats[col] = partial(_number_text, digits=1 if str(col).endswith(ONE_DECIMAL_SUFFIXES) else 2)
        else:
            formats[col] = _cell_text
    return frame.style.format(formats)


CHARGE_NAMES = {"compressed": "as stored", "decompressed": "decompressed at load"}
