"""The Bandwidth page's and the report's charts of measured tok/s against graph bytes: pure functions of a
``device.crosscheck.CrossCheckReport``, each ``*_figure`` drawing the frame of its ``*_frame``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from analyzer import fmt
from analyzer.fmt import MB
from analyzer.predict.bandwidth_model import DEFAULT_MAX_RESIDUAL_PCT
from analyzer.predict.fit import BandwidthFit
from analyzer.predict.roof_check import RoofRow
from analyzer.report.figures import CATEGORY_COLORS, COLOR_A, COLOR_B, DEVICE_COLORS, log_axis, style

BANDWIDTH_COLUMNS = ("build", "device", "n", "measured_tok_per_s", "graph_bytes_per_token",
                     "inferred_bytes_per_token", "predicted_tok_per_s", "residual_pct", "gap_bytes", "gap_pct",
                     "bw_bytes_per_s", "overhead_s", "bw_source")


def bandwidth_frame(report: Any) -> pd.DataFrame:
    """One row per (build, device) of an ``analyzer.predict.crosscheck.CrossCheckReport``."""
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
        name, builds = fmt.plot_text(device), [fmt.plot_text(b) for b in part["build"]]  # the logs' text
        graph_mb = [int(v) / MB for v in part["graph_bytes_per_token"]]
        xs.extend(graph_mb)
        fig.add_scatter(x=graph_mb, y=list(part["measured_tok_per_s"]), mode="markers+text", name=name,
                        text=builds, textposition="top center", marker={"size": 11, "color": color},
                        hovertemplate="%{text}<br>graph %{x:,.0f} MB/token<br>measured %{y:.2f} tok/s"
                                      "<extra>" + name + "</extra>")
        inferred = part[part["inferred_bytes_per_token"].notna()]
        if len(inferred):
            inf_mb = [int(v) / MB for v in inferred["inferred_bytes_per_token"]]
            xs.extend(inf_mb)
            fig.add_scatter(x=inf_mb, y=list(inferred["measured_tok_per_s"]), mode="markers",
                            name=f"{name}: inferred bytes", text=[fmt.plot_text(b) for b in inferred["build"]],
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
    fig.update_xaxes(**log_axis(xs or [lo, hi], "bytes per token (MB = 10^6 B, log)"))
    fig.update_yaxes(**log_axis(tok, "tok/s (log)"))
    fig = style(fig, "Measured tok/s vs bytes per token: graph (●) and inferred (○)", height=520)
    fig.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.16, "xanchor": "left", "x": 0.0},
                      margin={"b": 140})
    return fig


def inferred_vs_graph_figure(frame: pd.DataFrame) -> go.Figure:
    """Per (build, device): the bytes its tok/s implies beside the bytes its graph counts (MB)."""
    part = frame[frame["inferred_bytes_per_token"].notna() | frame["graph_bytes_per_token"].notna()]
    names = [fmt.plot_text(f"{b} · {d}") for b, d in zip(part["build"], part["device"], strict=True)]
    fig = go.Figure()
    for col, label, color in (("inferred_bytes_per_token", "inferred from tok/s", COLOR_B),
                              ("graph_bytes_per_token", "graph (program tensor shapes)", COLOR_A)):
        values = [None if pd.isna(v) else int(v) / MB for v in part[col]]
        fig.add_bar(x=names, y=values, name=label, marker_color=color,
                    hovertemplate="%{x}: %{y:,.0f} MB/token<extra>" + label + "</extra>")
    return style(fig, "Inferred vs graph bytes per token (MB)", barmode="group", yaxis_title="MB per token",
                   xaxis_tickangle=-20)


def residual_bandwidth(frame: pd.DataFrame) -> str:
    """The bandwidth the rows' predictions (and so their residuals) used: one value and its source, or each
    device's own when they differ (a second figure on a page says which bandwidth it used)."""
    used = list(dict.fromkeys(zip(frame["bw_bytes_per_s"], frame["bw_source"], strict=True)))
    if len(used) == 1:
        bw, source = used[0]
        return fmt.plot_text(f"{fmt.bandwidth(float(bw))} ({source})")
    return "each device's bandwidth (the table's bw_source)"


def residual_figure(frame: pd.DataFrame, threshold_pct: float = DEFAULT_MAX_RESIDUAL_PCT) -> go.Figure:
    """(measured − predicted) / measured per mapped (build, device), in percent; bars beyond
    ``threshold_pct`` are drawn red."""
    part = frame[frame["residual_pct"].notna()]
    names = [fmt.plot_text(f"{b} · {d}") for b, d in zip(part["build"], part["device"], strict=True)]
    values = [float(v) for v in part["residual_pct"]]
    colors = [CATEGORY_COLORS["replication"] if abs(v) > threshold_pct else CATEGORY_COLORS["kv_write"] for v in values]
    fig = go.Figure(go.Bar(x=names, y=values, marker_color=colors, text=[f"{v:+.1f}%" for v in values],
                           textposition="outside", hovertemplate="%{x}: %{y:+.1f}%<extra></extra>"))
    fig.add_hline(y=0, line={"color": "#666", "width": 1})
    span = max([abs(v) for v in values] + [1.0])
    return style(fig, f"Residuals at {residual_bandwidth(part)}: (measured − predicted) / measured", yaxis_title="%",
                   yaxis_range=[-span * 1.3, span * 1.3], showlegend=False, xaxis_tickangle=-20)



def bandwidth_curves(bw_bytes_per_s: float, fits: Sequence[BandwidthFit]) -> tuple[BandwidthCurve, ...]:
    """The bandwidth setting's line and one dashed line per usable fit (with its overhead), for the chart."""
    curves = [BandwidthCurve(f"BW {fmt.bandwidth(bw_bytes_per_s)} (the bandwidth setting)", bw_bytes_per_s)]
    for f in fits:
        if f.usable:
            extra = f" + {f.overhead_s * 1e3:.2f} ms" if f.model == "bandwidth+overhead" else ""
            curves.append(BandwidthCurve(f"fit {fmt.plot_text(f.device)}: {fmt.bandwidth(f.bw_bytes_per_s)}{extra}",
                                         f.bw_bytes_per_s, max(f.overhead_s, 0.0), dash="dash", color="#888"))
    return tuple(curves)


ROOF_COLUMNS = ("file", "line", "device", "build", "phase", "context_length", "tok_per_s", "roof_tok_per_s",
                "roof_bytes_per_token", "roof_bw_bytes_per_s", "roof_profile", "flags", "why")


def roof_frame(rows: Sequence[RoofRow]) -> pd.DataFrame:
    """One row per log row held against its roof (``analyzer.predict.roof_check``): the roof, the bytes and the
    bandwidth it used, the flags (``above_roof``, ``far_below_roof``) and how the roof was found or why none."""
    frame = pd.DataFrame([{**{c: getattr(r, c) for c in ROOF_COLUMNS if c != "flags"}, "flags": ", ".join(r.flags)}
                          for r in rows], columns=list(ROOF_COLUMNS))
    for c in ("context_length", "roof_bytes_per_token", "roof_bw_bytes_per_s"):
        frame[c] = frame[c].astype("Int64")
    return frame


def roof_curves(rows: Sequence[RoofRow], devices: Sequence[str] = ()) -> tuple[BandwidthCurve, ...]:
    """One dotted line per device whose rows have a roof: tok/s = its cited bandwidth ÷ bytes per token (the
    fastest any build can run there), in the colour of the device's points (``devices``: the chart's order); a
    device held against two profiles (two compute units) gets both."""
    order = list(dict.fromkeys([*devices, *(r.device for r in rows)]))
    seen = dict.fromkeys((r.device, r.roof_profile, r.roof_bw_bytes_per_s) for r in rows
                         if r.roof_bw_bytes_per_s is not None)
    return tuple(BandwidthCurve(f"roof {fmt.plot_text(device)}: {fmt.bandwidth(float(bw))} ({profile})", float(bw),
                                dash="dot", color=DEVICE_COLORS[order.index(device) % len(DEVICE_COLORS)])
                 for device, profile, bw in seen)
