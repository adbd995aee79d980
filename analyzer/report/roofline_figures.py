"""Decode and prefill side by side, and the roofline chart: pure functions of analyses and their
:class:`~analyzer.predict.roofline.CallPrediction` s, each ``*_figure`` drawing the frame of its ``*_frame``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go

from analyzer import fmt
from analyzer.analysis.record import Analysis
from analyzer.predict.roofline import CallPrediction, PrefillRun, Roof, TimeToFirstToken, predict
from analyzer.report.figures import COLOR_A, COLOR_B, DEVICE_COLORS, log_axis, style

PHASE_COLUMNS = ("side", "label", "phase", "tokens_per_call", "kv_replication_tiles", "tile_output_bytes",
                 "bytes_per_call", "bytes_per_token", "flops_per_call", "flops_per_token", "intensity_flops_per_byte",
                 "bound", "memory_s", "compute_s", "time_per_call_s", "tok_per_s")
TTFT_COLUMNS = ("side", "label", "prompt_tokens", "calls", "via", "seconds", "how")
_SIDE_COLORS = {"A": COLOR_A, "B": COLOR_B}
_PHASE_SYMBOLS = {"decode": "circle", "prefill": "diamond"}


@dataclass(frozen=True, slots=True)
class PhasePoint:
    """One function of one side of the A/B (``side`` "A"/"B"), its analysis and its call on the roof."""

    side: str
    label: str
    analysis: Analysis
    call: CallPrediction


def phase_points(side: str, label: str, analyses: Sequence[Analysis], roof: Roof) -> list[PhasePoint]:
    """Every analysed function of one side (its decode and, when there is one, its prefill) on ``roof``."""
    return [PhasePoint(side, label, a, predict(a, roof, f"{side} · {a.call.phase}")) for a in analyses]


def phase_frame(points: Sequence[PhasePoint]) -> pd.DataFrame:
    """One row per (side, phase): tiles, bytes, FLOPs (per call and per token: per prompt token for a prefill),
    intensity, the bound, time per call and tok/s on the roof."""
    rows = []
    for p in points:
        a, c = p.analysis, p.call
        rows.append({
            "side": p.side, "label": p.label, "phase": c.phase, "tokens_per_call": c.tokens_per_call,
            "kv_replication_tiles": a.summary.kv_replication_tiles, "tile_output_bytes": a.summary.tile_output_bytes,
            "bytes_per_call": c.bytes_per_call, "bytes_per_token": round(c.bytes_per_call / c.tokens_per_call),
            "flops_per_call": c.flops_per_call, "flops_per_token": a.flops.per_token().total,
            "intensity_flops_per_byte": c.intensity_flops_per_byte, "bound": c.bound, "memory_s": c.memory_s,
            "compute_s": c.compute_s, "time_per_call_s": c.time_per_call_s, "tok_per_s": c.tok_per_s,
        })
    return pd.DataFrame(rows, columns=list(PHASE_COLUMNS))


def ttft_frame(rows: Sequence[tuple[str, str, TimeToFirstToken]]) -> pd.DataFrame:
    """Time to first token per side: ``(side, label, TimeToFirstToken)``."""
    return pd.DataFrame([{"side": s, "label": label, "prompt_tokens": t.prompt_tokens, "calls": t.calls,
                          "via": t.via.phase, "seconds": t.seconds, "how": t.how} for s, label, t in rows],
                        columns=list(TTFT_COLUMNS))


def roof_line(roof: Roof, x_lo: float, x_hi: float) -> tuple[list[float], list[float]]:
    """The roof as a polyline over ``[x_lo, x_hi]`` FLOP/byte: the bandwidth slope up to the ridge, then flat."""
    ridge = roof.ridge_flops_per_byte
    xs = [x_lo, *([ridge] if x_lo < ridge < x_hi else []), x_hi]
    return xs, [roof.attainable_flops_per_s(x) for x in xs]


def _ridge(fig: go.Figure, roof: Roof, line_y: Sequence[float]) -> None:
    """The ridge as a dotted vertical segment in data coordinates, from the roof's foot to its ceiling, labelled at
    the top (a ``add_vline`` annotation on a log axis is read as the log10 of its position: 10^ridge)."""
    ridge = roof.ridge_flops_per_byte
    fig.add_scatter(x=[ridge, ridge], y=[min(line_y), roof.flops_per_s], mode="lines+text",
                    text=["", f"ridge {ridge:,.0f} FLOP/byte"], textposition="top right", name="ridge",
                    line={"dash": "dot", "color": "#888", "width": 1}, showlegend=False,
                    hovertemplate="ridge: %{x:,.0f} FLOP/byte<extra></extra>")


def roofline_figure(frame: pd.DataFrame, roof: Roof) -> go.Figure:
    """Operational intensity (FLOP/byte) against attainable FLOP/s, both axes logarithmic: the device's roof
    (bandwidth slope, compute ceiling, the ridge between them) and every (side, phase) of ``phase_frame`` at the
    FLOP/s its bound lets it reach."""
    xs = [float(v) for v in frame["intensity_flops_per_byte"] if math.isfinite(float(v)) and float(v) > 0]
    ridge = roof.ridge_flops_per_byte
    x_lo = min([*xs, ridge]) / 4
    x_hi = max([*xs, ridge]) * 4
    fig = go.Figure()
    line_x, line_y = roof_line(roof, x_lo, x_hi)
    fig.add_scatter(x=line_x, y=line_y, mode="lines", name=f"roof: {roof.label}", line={"color": "#444", "width": 2},
                    hovertemplate="%{x:,.3g} FLOP/byte → %{y:,.3g} FLOP/s<extra>roof</extra>")
    _ridge(fig, roof, line_y)
    for i, ((side, phase), part) in enumerate(frame.groupby(["side", "phase"], sort=False)):
        color = _SIDE_COLORS.get(str(side), DEVICE_COLORS[i % len(DEVICE_COLORS)])
        flops = [int(f) / float(t) if float(t) > 0 else 0.0
                 for f, t in zip(part["flops_per_call"], part["time_per_call_s"], strict=True)]
        text = [f"{side} {phase}" for _ in range(len(part))]
        fig.add_scatter(
            x=list(part["intensity_flops_per_byte"]), y=flops, mode="markers+text", text=text,
            textposition="top center", name=fmt.plot_text(f"{side} · {phase} ({part['label'].iloc[0]})"),
            marker={"size": 13, "color": color, "symbol": _PHASE_SYMBOLS.get(str(phase), "square")},
            customdata=list(zip(part["bound"], part["time_per_call_s"] * 1e3, part["tok_per_s"], strict=True)),
            hovertemplate="%{text}<br>%{x:,.3g} FLOP/byte, %{y:,.3g} FLOP/s<br>%{customdata[0]}-bound, "
                          "%{customdata[1]:,.3f} ms per call, %{customdata[2]:,.1f} tok/s<extra></extra>")
    drawn_y = [v for trace in fig.data for v in trace.y if v is not None]
    fig.update_xaxes(**log_axis([x_lo, x_hi], "operational intensity (FLOP per byte moved)", pad=1.0))
    fig.update_yaxes(**log_axis(drawn_y, "attainable FLOP/s"))
    return style(fig, f"Roofline: each function of A and B on {roof.label}")


PREFILL_RUN_COLUMNS = ("build", "device", "n", "measured_tok_per_s", "tokens_per_call", "flops_per_token",
                       "bytes_per_token", "intensity_flops_per_byte", "implied_flops_per_s", "share_of_peak",
                       "predicted_tok_per_s", "bound", "note")


def prefill_runs_frame(runs: Sequence[PrefillRun]) -> pd.DataFrame:
    """One row per measured prefill condition: prompt tok/s, the FLOP/s it implies, the roofline's prediction."""
    rows = []
    for r in runs:
        intensity = (r.flops_per_token / r.bytes_per_token) if r.flops_per_token and r.bytes_per_token else None
        rows.append({**{c: getattr(r, c) for c in PREFILL_RUN_COLUMNS if c != "intensity_flops_per_byte"},
                     "intensity_flops_per_byte": intensity})
    frame = pd.DataFrame(rows, columns=list(PREFILL_RUN_COLUMNS))
    for c in ("tokens_per_call", "flops_per_token", "bytes_per_token"):
        frame[c] = frame[c].astype("Int64")
    return frame


def prefill_runs_figure(frame: pd.DataFrame, roof: Roof) -> go.Figure:
    """Measured prefill runs on the roofline: each at its analysis's intensity and the FLOP/s its prompt tok/s
    implies (filled), beside the roof's bound for the same intensity (open)."""
    placed = frame[frame["implied_flops_per_s"].notna()]
    xs = [float(v) for v in placed["intensity_flops_per_byte"]]
    ridge = roof.ridge_flops_per_byte
    x_lo, x_hi = min([*xs, ridge]) / 4, max([*xs, ridge]) * 4
    fig = go.Figure()
    line_x, line_y = roof_line(roof, x_lo, x_hi)
    fig.add_scatter(x=line_x, y=line_y, mode="lines", name=f"roof: {roof.label}", line={"color": "#444", "width": 2})
    for i, device in enumerate(dict.fromkeys(placed["device"])):
        part = placed[placed["device"] == device]
        color = DEVICE_COLORS[i % len(DEVICE_COLORS)]
        x = [float(v) for v in part["intensity_flops_per_byte"]]
        fig.add_scatter(x=x, y=[float(v) for v in part["implied_flops_per_s"]], mode="markers+text",
                        name=fmt.plot_text(device), text=[fmt.plot_text(b) for b in part["build"]],  # the logs' text
                        textposition="top center", marker={"size": 11, "color": color},
                        hovertemplate="%{text}: measured %{y:,.3g} FLOP/s at %{x:,.3g} FLOP/byte<extra></extra>")
        fig.add_scatter(x=x, y=[roof.attainable_flops_per_s(v) for v in x], mode="markers", showlegend=False,
                        marker={"size": 11, "color": color, "symbol": "circle-open"},
                        hovertemplate="roofline bound %{y:,.3g} FLOP/s<extra></extra>")
    _ridge(fig, roof, line_y)
    drawn_y = [v for trace in fig.data for v in trace.y if v is not None]
    fig.update_xaxes(**log_axis([x_lo, x_hi], "operational intensity of the prefill call (FLOP per byte moved)",
                                pad=1.0))
    fig.update_yaxes(**log_axis(drawn_y, "FLOP/s (measured prompt tok/s × FLOPs per prompt token)"))
    return style(fig, f"Prefill runs against the compute roof of {roof.label}")
