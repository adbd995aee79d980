"""The dashboard's and the report's tables and charts: pure functions, plotly only, no streamlit.

Every chart comes as a pair: a ``*_frame`` that builds its numbers (the table shown or downloaded beside
it; bytes stay ints) and a ``*_figure`` that draws exactly that frame, so a test can check that what is
drawn is what is tabled. MiB (2^20 bytes) and MB (10^6 bytes) appear only on axes and labels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analyzer.device.bandwidth import DEFAULT_MAX_RESIDUAL_PCT
from analyzer.fmt import MB, MIB
from analyzer.graph.accounting import CATEGORIES

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


def _layout(fig: go.Figure, title: str, **kwargs: Any) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0.0, "xanchor": "left"}, margin={"l": 60, "r": 20, "t": 60, "b": 50},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.0, "xanchor": "right", "x": 1.0},
                      template="plotly_white", **kwargs)
    return fig


def layer_name(layer: int | None) -> str:
    return OUTSIDE_LAYERS if layer is None else str(layer)


# ------------------------------------------------------------------------------------------------- categories
def category_frame(diff: dict[str, Any]) -> pd.DataFrame:
    """Bytes per decode token by category, A and B (from ``diff.diff_documents``).

    Rows: the five categories, ``total`` (their sum) and ``kv_write_value_semantics`` (what a whole-tensor
    ``slice_update`` would write; shown beside the totals, not in them: ``in_total`` says which).
    """
    b = diff["bytes_per_token"]
    rows = []
    for key in (*CATEGORIES, "total", "kv_write_value_semantics"):
        rows.append({"category": key, "a_bytes": int(b[key]["a"]), "b_bytes": int(b[key]["b"]),
                     "delta_bytes": int(b[key]["delta"]), "in_total": key in CATEGORIES})
    return pd.DataFrame(rows)


def waterfall_figure(frame: pd.DataFrame, label_a: str = "A", label_b: str = "B") -> go.Figure:
    """A's total, each category's change, B's total, in MiB per token."""
    cats = frame[frame["in_total"]]
    total = frame.set_index("category").loc["total"]
    x = [f"{label_a} total", *cats["category"], f"{label_b} total"]
    y_bytes = [int(total["a_bytes"]), *(int(v) for v in cats["delta_bytes"]), int(total["b_bytes"])]
    y = [v / MIB for v in y_bytes]
    text = [f"{v / MIB:,.1f}" if i in (0, len(y) - 1) else f"{v / MIB:+,.1f}" if v else ""
            for i, v in enumerate(y_bytes)]
    fig = go.Figure(go.Waterfall(
        x=x, y=y, measure=["absolute", *["relative"] * len(cats), "total"], text=text, textposition="outside",
        customdata=y_bytes, hovertemplate="%{x}: %{customdata:,} B<extra></extra>",
        increasing={"marker": {"color": CATEGORY_COLORS["replication"]}},
        decreasing={"marker": {"color": CATEGORY_COLORS["kv_write"]}},
        totals={"marker": {"color": COLOR_A}}, connector={"line": {"color": "#999", "dash": "dot"}},
    ))
    top = max(max(y), 1e-9)
    return _layout(fig, f"Bytes per decode token: {label_a} → {label_b} (MiB)", yaxis_title="MiB per token",
                   yaxis_range=[0, top * 1.15], showlegend=False)


def category_bars_figure(frame: pd.DataFrame, label_a: str = "A", label_b: str = "B") -> go.Figure:
    """Bytes per token by category, A and B side by side (MiB)."""
    cats = frame[frame["in_total"]]
    fig = go.Figure()
    for col, label, color in (("a_bytes", label_a, COLOR_A), ("b_bytes", label_b, COLOR_B)):
        fig.add_bar(x=cats["category"], y=cats[col] / MIB, name=label, marker_color=color,
                    customdata=cats[col], hovertemplate="%{x}: %{customdata:,} B<extra>" + label + "</extra>")
    return _layout(fig, "Bytes per decode token by category (MiB)", barmode="group", yaxis_title="MiB per token")


# ------------------------------------------------------------------------------------------------- op counts
def op_count_frame(diff: dict[str, Any], changed_only: bool = False) -> pd.DataFrame:
    """Op type, count in A, count in B, B − A; sorted by the larger count."""
    rows = diff["op_count_deltas"] if changed_only else diff["op_counts"]
    frame = pd.DataFrame(rows, columns=["type", "a", "b", "delta"])
    if frame.empty:
        return frame.astype({"a": "int64", "b": "int64", "delta": "int64"})
    order = frame[["a", "b"]].max(axis=1).sort_values(ascending=False, kind="stable").index
    return frame.loc[order].reset_index(drop=True)


def op_count_figure(frame: pd.DataFrame, label_a: str = "A", label_b: str = "B") -> go.Figure:
    """Grouped bars of op counts per type; the B bar is labelled with its change."""
    fig = go.Figure()
    fig.add_bar(x=frame["type"], y=frame["a"], name=label_a, marker_color=COLOR_A)
    fig.add_bar(x=frame["type"], y=frame["b"], name=label_b, marker_color=COLOR_B,
                text=[f"{d:+,}" if d else "" for d in frame["delta"]], textposition="outside")
    return _layout(fig, "Op counts by type (with B − A)", barmode="group", yaxis_title="ops",
                   xaxis_tickangle=-45)


# ------------------------------------------------------------------------------------------------- tiles
TILE_COLUMNS = ("layer", "name", "input_shape", "output_shape", "dtype", "output_bytes", "kind")


def tile_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """The analysis's tile ops: layer, name, input and output shapes, dtype, output bytes, kind."""
    rows = [{**t, "input_shape": _shape(t.get("input_shape")), "output_shape": _shape(t.get("output_shape"))}
            for t in doc["summary"]["tiles"]]
    frame = pd.DataFrame(rows, columns=list(TILE_COLUMNS))
    frame["layer"] = frame["layer"].astype("Int64")
    frame["output_bytes"] = frame["output_bytes"].astype("int64")
    return frame


def _shape(shape: Sequence[int | None] | None) -> str:
    return "" if shape is None else "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


# ------------------------------------------------------------------------------------------------- layers
def bytes_by_layer_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """One analysis's bytes per token per decoder layer and category (``outside`` = no layer)."""
    rows = [{"layer": layer_name(r["layer"]), **{c: int(r.get(c, 0)) for c in CATEGORIES}, "total": int(r["total"])}
            for r in doc["bytes"]["bytes_by_layer"]]
    return pd.DataFrame(rows, columns=["layer", *CATEGORIES, "total"])


def bytes_per_token_frame(doc: dict[str, Any]) -> pd.DataFrame:
    """One analysis's bytes per token by category; ``in_total`` is False for the value-semantics figure."""
    b = doc["bytes"]["bytes_per_token"]
    return pd.DataFrame([{"category": k, "bytes": int(v), "in_total": k in CATEGORIES} for k, v in b.items()],
                        columns=["category", "bytes", "in_total"])


def layer_frame(doc_a: dict[str, Any], doc_b: dict[str, Any], label_a: str = "A",
                label_b: str = "B") -> pd.DataFrame:
    """Bytes per token per decoder layer and category, one row per (analysis, layer)."""
    parts = [bytes_by_layer_frame(doc).assign(analysis=label) for label, doc in ((label_a, doc_a), (label_b, doc_b))]
    return pd.concat(parts, ignore_index=True)[["analysis", "layer", *CATEGORIES, "total"]]


def layer_figure(frame: pd.DataFrame) -> go.Figure:
    """Side by side, one panel per analysis: bytes per layer stacked by category (MiB)."""
    labels = list(dict.fromkeys(frame["analysis"]))
    fig = make_subplots(rows=1, cols=max(len(labels), 1), shared_yaxes=True, subplot_titles=labels,
                        horizontal_spacing=0.04)
    for col, label in enumerate(labels, start=1):
        part = frame[frame["analysis"] == label]
        for cat in CATEGORIES:
            fig.add_bar(x=part["layer"], y=part[cat] / MIB, name=cat, marker_color=CATEGORY_COLORS[cat],
                        legendgroup=cat, showlegend=col == 1, customdata=part[cat],
                        hovertemplate="layer %{x}: %{customdata:,} B<extra>" + cat + "</extra>", row=1, col=col)
        fig.update_xaxes(type="category", title_text="layer", row=1, col=col)
    fig.update_yaxes(title_text="MiB per token", row=1, col=1)
    fig = _layout(fig, "Bytes per decode token by layer", barmode="stack")
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0.0},
                      margin={"b": 110})
    return fig


# ------------------------------------------------------------------------------------------------- ops
def op_frame(op_rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    """``accounting.ByteAccount.op_rows()`` as a frame (layer nullable)."""
    from analyzer.graph.accounting import OP_COLUMNS

    frame = pd.DataFrame(list(op_rows), columns=list(OP_COLUMNS))
    frame["layer"] = frame["layer"].astype("Int64")
    return frame


@dataclass(frozen=True, slots=True)
class Drilldown:
    """The ops behind one total: ``rows`` have non-zero ``bytes`` (the chosen category) and sum to
    ``sum_bytes``; ``reference_bytes`` is the total the same selection shows elsewhere (per token or per
    layer), None when there is none to compare with (an op-type filter)."""

    category: str
    rows: pd.DataFrame
    sum_bytes: int
    reference_bytes: int | None
    reference_label: str

    @property
    def matches(self) -> bool | None:
        return None if self.reference_bytes is None else self.sum_bytes == self.reference_bytes


def drilldown(ops: pd.DataFrame, doc: dict[str, Any], category: str = "total", layer: LayerFilter = "all",
              op_type: str | None = None) -> Drilldown:
    """Filter the op table to the ops that make up a total.

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
    total = int(rows["bytes"].sum())
    reference: int | None = None
    ref_label = ""
    if op_type is None and layer == "all":
        reference = int(doc["bytes"]["bytes_per_token"][category])
        ref_label = f"bytes per token, {category}"
    elif op_type is None:
        wanted = None if layer == OUTSIDE_LAYERS else int(layer)
        row = next((r for r in doc["bytes"]["bytes_by_layer"] if r["layer"] == wanted), None)
        reference = int(row[category]) if row is not None else 0
        ref_label = f"bytes per token of layer {layer_name(wanted)}, {category}"
    return Drilldown(category, rows, total, reference, ref_label)


# ------------------------------------------------------------------------------------------------- bandwidth
BANDWIDTH_COLUMNS = ("build", "device", "n", "measured_tok_per_s", "graph_bytes_per_token",
                     "inferred_bytes_per_token", "predicted_tok_per_s", "residual_pct", "gap_bytes", "gap_pct",
                     "bw_bytes_per_s", "overhead_s", "bw_source")


def bandwidth_frame(report: Any) -> pd.DataFrame:
    """One row per (build, device) of an ``analyzer.device.bandwidth.CrossCheckReport``."""
    rows = [{c: getattr(r, c) for c in BANDWIDTH_COLUMNS} for r in report.builds]
    frame = pd.DataFrame(rows, columns=list(BANDWIDTH_COLUMNS))
    for c in ("graph_bytes_per_token", "inferred_bytes_per_token", "gap_bytes"):
        frame[c] = frame[c].astype("Int64")
    return frame


PAIR_COLUMNS = ("device", "build_a", "build_b", "tok_per_s_a", "tok_per_s_b", "speedup",
                "inferred_bytes_per_token_a", "inferred_bytes_per_token_b", "inferred_diff_bytes",
                "graph_diff_bytes", "gap_bytes", "gap_pct", "bw_bytes_per_s")


def pairs_frame(report: Any) -> pd.DataFrame:
    """The write-up's A/B form for every pair of mapped builds on a device (a = more graph bytes)."""
    rows = [{c: getattr(p, c) for c in PAIR_COLUMNS} for p in report.pairs]
    frame = pd.DataFrame(rows, columns=list(PAIR_COLUMNS))
    for c in ("inferred_bytes_per_token_a", "inferred_bytes_per_token_b", "inferred_diff_bytes",
              "graph_diff_bytes", "gap_bytes"):
        frame[c] = frame[c].astype("Int64")
    return frame


@dataclass(frozen=True, slots=True)
class BandwidthCurve:
    """``tok/s = 1 / (bytes / bw + overhead)`` drawn as a line; ``dash`` for fitted curves."""

    label: str
    bw_bytes_per_s: float
    overhead_s: float = 0.0
    dash: str = "solid"
    color: str = "#444"


def bandwidth_figure(frame: pd.DataFrame, curves: Sequence[BandwidthCurve]) -> go.Figure:
    """Measured tok/s against graph MB per token, both axes logarithmic, with bandwidth curves.

    Builds without graph bytes cannot be placed and are left out (the table lists them). Each mapped
    build also shows, as an open marker on the same row, the bytes its tok/s implies at its bandwidth.
    """
    mapped = frame[frame["graph_bytes_per_token"].notna()]
    fig = go.Figure()
    xs: list[float] = []
    for i, device in enumerate(dict.fromkeys(mapped["device"])):
        part = mapped[mapped["device"] == device]
        color = DEVICE_COLORS[i % len(DEVICE_COLORS)]
        graph_mb = [int(v) / MB for v in part["graph_bytes_per_token"]]
        xs.extend(graph_mb)
        fig.add_scatter(x=graph_mb, y=list(part["measured_tok_per_s"]), mode="markers+text", name=device,
                        text=list(part["build"]), textposition="top center", marker={"size": 11, "color": color},
                        hovertemplate="%{text}<br>graph %{x:,.0f} MB/token<br>measured %{y:.2f} tok/s"
                                      "<extra>" + device + "</extra>")
        inferred = part[part["inferred_bytes_per_token"].notna()]
        if len(inferred):
            inf_mb = [int(v) / MB for v in inferred["inferred_bytes_per_token"]]
            xs.extend(inf_mb)
            fig.add_scatter(x=inf_mb, y=list(inferred["measured_tok_per_s"]), mode="markers",
                            name=f"{device}: inferred bytes", text=list(inferred["build"]),
                            marker={"size": 10, "color": color, "symbol": "circle-open", "line": {"width": 2}},
                            hovertemplate="%{text}<br>inferred %{x:,.0f} MB/token<br>%{y:.2f} tok/s"
                                          "<extra>inferred</extra>")
    lo, hi = (min(xs), max(xs)) if xs else (100.0, 10_000.0)
    grid = [lo / 2 * (hi * 2 / (lo / 2)) ** (k / 60) for k in range(61)]  # MB/token, log-spaced
    for c in curves:
        fig.add_scatter(x=grid, y=[1.0 / (g * MB / c.bw_bytes_per_s + c.overhead_s) for g in grid], mode="lines",
                        name=c.label, line={"dash": c.dash, "color": c.color, "width": 1.5},
                        hovertemplate="%{x:,.0f} MB/token → %{y:.2f} tok/s<extra>" + c.label + "</extra>")
    # The view is the measurements' (a fitted curve far off them must not squash the points into a corner).
    tok = [float(v) for v in mapped["measured_tok_per_s"]] or [1.0, 100.0]
    fig.update_xaxes(type="log", title_text="bytes per token (MB = 10^6 B, log)",
                     range=[math.log10(lo / 1.6), math.log10(hi * 1.6)])
    fig.update_yaxes(type="log", title_text="tok/s (log)", range=[math.log10(min(tok) / 2), math.log10(max(tok) * 2)])
    fig = _layout(fig, "Measured tok/s vs bytes per token: graph (●) and inferred (○)", height=520)
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.16, "xanchor": "left", "x": 0.0},
                      margin={"b": 140})
    return fig


def inferred_vs_graph_figure(frame: pd.DataFrame) -> go.Figure:
    """Per (build, device): the bytes its tok/s implies beside the bytes its graph counts (MB)."""
    part = frame[frame["inferred_bytes_per_token"].notna() | frame["graph_bytes_per_token"].notna()]
    names = [f"{b} · {d}" for b, d in zip(part["build"], part["device"], strict=True)]
    fig = go.Figure()
    for col, label, color in (("inferred_bytes_per_token", "inferred from tok/s", COLOR_B),
                              ("graph_bytes_per_token", "graph (MIL shapes)", COLOR_A)):
        values = [None if pd.isna(v) else int(v) / MB for v in part[col]]
        fig.add_bar(x=names, y=values, name=label, marker_color=color,
                    hovertemplate="%{x}: %{y:,.0f} MB/token<extra>" + label + "</extra>")
    return _layout(fig, "Inferred vs graph bytes per token (MB)", barmode="group", yaxis_title="MB per token",
                   xaxis_tickangle=-20)


def residual_figure(frame: pd.DataFrame, threshold_pct: float = DEFAULT_MAX_RESIDUAL_PCT) -> go.Figure:
    """(measured − predicted) / measured per mapped (build, device), in percent; bars beyond
    ``threshold_pct`` are drawn red."""
    part = frame[frame["residual_pct"].notna()]
    names = [f"{b} · {d}" for b, d in zip(part["build"], part["device"], strict=True)]
    values = [float(v) for v in part["residual_pct"]]
    colors = [CATEGORY_COLORS["replication"] if abs(v) > threshold_pct else CATEGORY_COLORS["kv_write"] for v in values]
    fig = go.Figure(go.Bar(x=names, y=values, marker_color=colors, text=[f"{v:+.1f}%" for v in values],
                           textposition="outside", hovertemplate="%{x}: %{y:+.1f}%<extra></extra>"))
    fig.add_hline(y=0, line={"color": "#666", "width": 1})
    span = max([abs(v) for v in values] + [1.0])
    return _layout(fig, "Residuals: (measured − predicted) / measured", yaxis_title="%",
                   yaxis_range=[-span * 1.3, span * 1.3], showlegend=False, xaxis_tickangle=-20)

