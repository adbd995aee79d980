"""The dashboard's and the report's tables and charts: pure functions, plotly only, no streamlit.

Every chart comes as a pair: a ``*_frame`` that builds its numbers (the table shown or downloaded beside
it; bytes stay ints) and a ``*_figure`` that draws exactly that frame, so a test can check that what is
drawn is what is tabled. MiB (2^20 bytes) and MB (10^6 bytes) appear only on axes and labels.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analyzer import fmt
from analyzer.analysis.accounting import CATEGORIES, OP_COLUMNS
from analyzer.analysis.record import Analysis
from analyzer.compare.diff import ABDiff
from analyzer.fmt import MIB

COLOR_A = "#4C78A8"
COLOR_B = "#F58518"
CATEGORY_COLORS: dict[str, str] = {
    "weights": "#4C78A8",
    "kv_read": "#72B7B2",
    "kv_write": "#54A24B",
    "replication": "#E45756",
    "activations": "#B279A2",
}
DEVICE_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#B279A2", "#72B7B2", "#EECA3B", "#9D755D")
OUTSIDE_LAYERS = "outside"  # ops outside any decoder layer: embedding, RoPE tables, final norm, lm_head

LayerFilter = int | Literal["all", "outside"]


def style(fig: go.Figure, title: str, **kwargs: Any) -> go.Figure:
    """The house layout of every chart: title left, legend on top, white template."""
    fig.update_layout(title={"text": title, "x": 0.0, "xanchor": "left"}, margin={"l": 60, "r": 20, "t": 60, "b": 50},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
                      template="plotly_white", **kwargs)
    return fig


LOG_PAD = 1.6  # a log axis reaches a factor 1.6 (0.2 decade) past its extreme values: markers and labels stay whole
_SI_STEPS = ((1e15, 1e15, "P"), (1e12, 1e12, "T"), (1e9, 1e9, "G"), (1e6, 1e6, "M"), (1e4, 1e3, "k"))  # from, scale


def tick_label(value: float) -> str:
    """A log axis's tick as the value it marks: ``0.5``, ``20``, ``5,000``, ``20k``, ``1G``, ``10T`` (from 10^4 up
    with an SI prefix, below with thousands separators), never plotly's bare leading digit."""
    for start, scale, prefix in _SI_STEPS:
        if value >= start:
            return f"{value / scale:,.3g}{prefix}"
    return f"{value:,.0f}" if value >= 1 else f"{value:.3g}"


def log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Ticks for a log axis over ``[lo, hi]`` (data units): 1-2-5 in each decade up to 3 decades, every power of ten
    beyond (a label per decade either way), each labelled with its value (:func:`tick_label`)."""
    steps = (1, 2, 5) if math.log10(hi / lo) <= 3 else (1,)
    ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) for m in steps]
    shown = [t for t in ticks if lo <= t <= hi]
    return shown, [tick_label(t) for t in shown]


def log_axis(values: Sequence[float], title: str, pad: float = LOG_PAD) -> dict[str, Any]:
    """A log axis's settings (for ``update_xaxes``/``update_yaxes``) whose range holds every positive finite value of
    ``values`` with ``pad`` to spare, labelled by :func:`log_ticks`; ``title`` carries the unit."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v)) and float(v) > 0] or [1.0, 10.0]
    lo, hi = min(finite) / pad, max(finite) * pad
    tickvals, ticktext = log_ticks(lo, hi)
    return {"type": "log", "title_text": title, "range": [math.log10(lo), math.log10(hi)], "tickvals": tickvals,
            "ticktext": ticktext, "autorange": False}


def layer_name(layer: int | None) -> str:
    return OUTSIDE_LAYERS if layer is None else str(layer)


# ------------------------------------------------------------------------------------------------- categories
def category_frame(diff: ABDiff) -> pd.DataFrame:
    """Bytes per decode token by category, A and B (from ``graph.diff.diff_analyses``).

    Rows: the five categories, ``total`` (their sum) and ``kv_write_value_semantics`` (what a whole-tensor
    ``slice_update`` would write; shown beside the totals, not in them: ``in_total`` says which).
    """
    rows = [{"category": key, "a_bytes": c.a, "b_bytes": c.b, "delta_bytes": c.delta, "in_total": key in CATEGORIES}
            for key, c in diff.bytes_per_token.items()]
    return pd.DataFrame(rows)


WATERFALL_HEIGHT_PX = 460  # the report's default chart height; the A/B page draws it at the same height
LABEL_WRAP_CHARS = 24  # a label line on the waterfall's category axis
LABEL_MAX_LINES = 3
LABEL_CHAR_PX = 7.2  # plotly's default 12 px font averages ~0.6 em per character (Open Sans)
TITLE_WRAP_CHARS = 70
TITLE_LINE_PX = 22  # a 17 px title line with its leading


def wrap_label(text: str, width: int = LABEL_WRAP_CHARS, max_lines: int = LABEL_MAX_LINES) -> str:
    """``text`` broken into plotly lines (``<br>``) of at most ``width`` characters, at most ``max_lines`` of them
    (the last one ending in ``…`` when text was cut): a long build label never squeezes the plot."""

    lines = textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]
    if len(lines) > max_lines:
        lines = [*lines[:max_lines - 1], lines[max_lines - 1][:width - 1] + "…"]
    return "<br>".join(map(fmt.plot_text, lines))  # a label is a package's or a log's text: never markup


def label_lines(text: str) -> list[str]:
    return text.split("<br>")


def flops_frame(diff: ABDiff) -> pd.DataFrame:
    """FLOPs per token by category, A and B (per prompt token for a prefill function; conventions in
    ``analyzer.analysis.flops``), with the per-call figures beside them."""
    calls = diff.flops_per_call
    return pd.DataFrame([{"category": key, "a_flops": c.a, "b_flops": c.b, "delta_flops": c.delta,
                          "a_flops_per_call": calls[key].a, "b_flops_per_call": calls[key].b}
                         for key, c in diff.flops_per_token.items()])


def waterfall_figure(frame: pd.DataFrame, label_a: str = "A", label_b: str = "B") -> go.Figure:
    """A's total, each category's change, B's total, per decode token: horizontal bars, so category and build
    labels of any length sit in a left margin sized to them (wrapped at ``LABEL_WRAP_CHARS``) instead of
    squeezing the plot; the unit (KiB/MiB/GiB) is the one the larger total reads best in."""
    cats = frame[frame["in_total"]]
    total = frame.set_index("category").loc["total"]
    names = [wrap_label(f"{label_a} total"), *(wrap_label(str(c)) for c in cats["category"]),
             wrap_label(f"{label_b} total")]
    y_bytes = [int(total["a_bytes"]), *(int(v) for v in cats["delta_bytes"]), int(total["b_bytes"])]
    unit = fmt.pick_unit(max(abs(y_bytes[0]), abs(y_bytes[-1])))
    scale = fmt.UNITS[unit]
    x = [v / scale for v in y_bytes]
    text = [fmt.size(v, unit, None, suffix=False) if i in (0, len(x) - 1) else
            fmt.size(v, unit, None, sign=True, suffix=False) if v else "" for i, v in enumerate(y_bytes)]
    fig = go.Figure(go.Waterfall(
        orientation="h", y=names, x=x, measure=["absolute", *["relative"] * len(cats), "total"], text=text,
        textposition="outside", cliponaxis=False, customdata=y_bytes,
        hovertemplate="%{y}: %{customdata:,} B<extra></extra>",
        increasing={"marker": {"color": CATEGORY_COLORS["replication"]}},
        decreasing={"marker": {"color": CATEGORY_COLORS["kv_write"]}},
        totals={"marker": {"color": COLOR_A}}, connector={"line": {"color": "#999", "dash": "dot"}},
    ))
    longest = max(len(line) for name in names for line in label_lines(name))
    pair = f"{label_a} → {label_b}" if len(label_a) + len(label_b) <= TITLE_WRAP_CHARS // 2 else "A → B"
    title = wrap_label(f"Bytes per decode token: {pair} ({unit})", TITLE_WRAP_CHARS, 2)
    top = 30 + TITLE_LINE_PX * len(label_lines(title))
    right = max(x[0], x[-1], 1e-9)
    fig = style(fig, title, xaxis_title=f"{unit} per token", xaxis_range=[0, right * 1.18], showlegend=False,
                height=WATERFALL_HEIGHT_PX)
    fig.update_layout(margin={"l": round(longest * LABEL_CHAR_PX) + 20, "r": 30, "t": top, "b": 50})
    fig.update_yaxes(autorange="reversed", automargin=False)
    return fig


def category_bars_figure(frame: pd.DataFrame, label_a: str = "A", label_b: str = "B") -> go.Figure:
    """Bytes per token by category, A and B side by side (MiB)."""
    cats = frame[frame["in_total"]]
    fig = go.Figure()
    for col, label, color in (("a_bytes", fmt.plot_text(label_a), COLOR_A), ("b_bytes", fmt.plot_text(label_b),
                                                                               COLOR_B)):
        fig.add_bar(x=cats["category"], y=cats[col] / MIB, name=label, marker_color=color,
                    customdata=cats[col], hovertemplate="%{x}: %{customdata:,} B<extra>" + label + "</extra>")
    return style(fig, "Bytes per decode token by category (MiB)", barmode="group", yaxis_title="MiB per token")


# ------------------------------------------------------------------------------------------------- op counts
def op_count_frame(diff: ABDiff, changed_only: bool = False) -> pd.DataFrame:
    """Op type, count in A, count in B, B − A; sorted by the larger count."""
    rows = diff.op_count_deltas if changed_only else diff.op_counts
    frame = pd.DataFrame([{"type": r.type, "a": r.a, "b": r.b, "delta": r.delta} for r in rows],
                         columns=["type", "a", "b", "delta"])
    if frame.empty:
        return frame.astype({"a": "int64", "b": "int64", "delta": "int64"})
    order = frame[["a", "b"]].max(axis=1).sort_values(ascending=False, kind="stable").index
    return frame.loc[order].reset_index(drop=True)


def op_count_figure(frame: pd.DataFrame, label_a: str = "A", label_b: str = "B") -> go.Figure:
    """Grouped bars of op counts per type; the B bar is labelled with its change."""
    fig = go.Figure()
    fig.add_bar(x=frame["type"], y=frame["a"], name=fmt.plot_text(label_a), marker_color=COLOR_A)
    fig.add_bar(x=frame["type"], y=frame["b"], name=fmt.plot_text(label_b), marker_color=COLOR_B,
                text=[f"{d:+,}" if d else "" for d in frame["delta"]], textposition="outside")
    return style(fig, "Op counts by type (with B − A)", barmode="group", yaxis_title="ops",
                   xaxis_tickangle=-45)


# ------------------------------------------------------------------------------------------------- tiles
TILE_COLUMNS = ("layer", "name", "input_shape", "output_shape", "dtype", "output_bytes", "kind")


def tile_frame(analysis: Analysis) -> pd.DataFrame:
    """The analysis's tile ops: layer, name, input and output shapes, dtype, output bytes, kind."""
    rows = [{"layer": t.layer, "name": t.name, "input_shape": _shape(t.input_shape),
             "output_shape": _shape(t.output_shape), "dtype": t.dtype, "output_bytes": t.output_bytes, "kind": t.kind}
            for t in analysis.summary.tiles]
    frame = pd.DataFrame(rows, columns=list(TILE_COLUMNS))
    frame["layer"] = frame["layer"].astype("Int64")
    frame["output_bytes"] = frame["output_bytes"].astype("Int64")
    return frame


def _shape(shape: Sequence[int | None] | None) -> str:
    return "" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


# ------------------------------------------------------------------------------------------------- layers
def bytes_by_layer_frame(analysis: Analysis) -> pd.DataFrame:
    """One analysis's bytes per token per decoder layer and category (``outside`` = no layer)."""
    rows = [{"layer": layer_name(r.layer), **{c: r.get(c) for c in CATEGORIES}, "total": r.total}
            for r in analysis.bytes_by_layer]
    return pd.DataFrame(rows, columns=["layer", *CATEGORIES, "total"])


def bytes_per_token_frame(analysis: Analysis) -> pd.DataFrame:
    """One analysis's bytes per token by category; ``in_total`` is False for the value-semantics figure."""
    b = analysis.bytes_per_token.to_json()
    return pd.DataFrame([{"category": k, "bytes": v, "in_total": k in CATEGORIES} for k, v in b.items()],
                        columns=["category", "bytes", "in_total"])


def layer_frame(a: Analysis, b: Analysis, label_a: str = "A", label_b: str = "B") -> pd.DataFrame:
    """Bytes per token per decoder layer and category, one row per (analysis, layer)."""
    parts = [bytes_by_layer_frame(x).assign(analysis=label) for label, x in ((label_a, a), (label_b, b))]
    return pd.concat(parts, ignore_index=True)[["analysis", "layer", *CATEGORIES, "total"]]


def layer_figure(frame: pd.DataFrame) -> go.Figure:
    """Side by side, one panel per analysis: bytes per layer stacked by category (MiB)."""
    labels = list(dict.fromkeys(frame["analysis"]))
    fig = make_subplots(rows=1, cols=max(len(labels), 1), shared_yaxes=True,
                        subplot_titles=[fmt.plot_text(label) for label in labels],
                        horizontal_spacing=0.04)
    for col, label in enumerate(labels, start=1):
        part = frame[frame["analysis"] == label]
        for cat in CATEGORIES:
            fig.add_bar(x=part["layer"], y=part[cat] / MIB, name=cat, marker_color=CATEGORY_COLORS[cat],
                        legendgroup=cat, showlegend=col == 1, customdata=part[cat],
                        hovertemplate="layer %{x}: %{customdata:,} B<extra>" + cat + "</extra>", row=1, col=col)
        fig.update_xaxes(type="category", title_text="layer", row=1, col=col)
    fig.update_yaxes(title_text="MiB per token", row=1, col=1)
    fig = style(fig, "Bytes per decode token by layer", barmode="stack")
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0.0},
                      margin={"b": 110})
    return fig


# ------------------------------------------------------------------------------------------------- ops
def op_frame(op_rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """``accounting.ByteAccount.op_rows()`` as a frame (layer nullable)."""

    frame = pd.DataFrame(list(op_rows), columns=list(OP_COLUMNS))
    frame["layer"] = frame["layer"].astype("Int64")
    return frame


@dataclass(frozen=True, slots=True)
class Drilldown:
    """The ops behind a figure: ``rows`` have non-zero ``bytes`` (the chosen category), largest first, and
    sum to ``sum_bytes``."""

    category: str
    rows: pd.DataFrame
    sum_bytes: int


def drilldown(ops: pd.DataFrame, category: str = "total", layer: LayerFilter = "all",
              op_type: str | None = None) -> Drilldown:
    """Filter the op table to the ops that move ``category`` bytes.

    ``category`` is one of CATEGORIES or ``"total"``; ``layer`` a layer index, ``"outside"`` or ``"all"``;
    ``op_type`` an op type or None for all.
    """
    if category not in (*CATEGORIES, "total"):
        raise ValueError(f"category {category!r}: choose one of {', '.join((*CATEGORIES, 'total'))}")
    mask = pd.Series(True, index=ops.index)
    if layer == OUTSIDE_LAYERS:
        mask &= ops["layer"].isna()
    elif layer != "all":
        mask &= ops["layer"].eq(int(layer)).fillna(False).astype(bool)
    if op_type is not None:
        mask &= ops["type"] == op_type
    rows = ops[mask].copy()
    rows.insert(0, "bytes", rows[category].astype("int64"))
    rows = rows[rows["bytes"] != 0].sort_values("bytes", ascending=False, kind="stable").reset_index(drop=True)
    return Drilldown(category, rows, int(rows["bytes"].sum()))
