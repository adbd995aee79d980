"""The Sweeps page's numbers and charts: pure functions (frame in, plotly figure out), no streamlit.

As in ``analyzer.report.figures``, each chart draws exactly the frame that is shown and downloaded beside it:
``sweep_frame`` holds one row per finished point (bytes stay ints), ``measured_frame`` one row per measured
condition (runs averaged as seconds per token). Both charts have log axes and name their units; one line per
(model, variant, compression), measured points as markers. A point derived from converted points (status
``derived``, ``analyzer.sweep.derive``) is an open marker whose hover names the ctx it came from; the
``provenance`` column says the same in the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from analyzer import fmt
from analyzer.fmt import MB
from analyzer.report.figures import DEVICE_COLORS, log_axis, style
from analyzer.sweep.table import FINISHED
from analyzer.sweep.timing_report import observations_from

SWEEP_COLUMNS: tuple[str, ...] = ("line", "model", "variant", "compression", "ctx", "phase", "status", "provenance",
                                  "tile_count", "bytes_total", "bytes_kv_read", "bytes_replication", "bytes_weights",
                                  "predicted_tok_per_s", "device_profile", "key", "derived_from_ctx")
MEASURED_COLUMNS: tuple[str, ...] = ("device", "build", "context_length", "n_runs", "tok_per_s")
DASH = {"repeat_kv": "solid", "qfold": "dash"}
DERIVED_LEGEND = "○ derived from converted points (affine in ctx)"


def provenance(status: str, derived_from_ctx: str) -> str:
    """Where a row's figures come from, in words: converted, or derived from which ctx."""
    if status != "derived":
        return "converted" if status == "built" else "converted (reused)"
    ctx = [c for c in str(derived_from_ctx).split(",") if c.strip()]
    if len(ctx) != 3:
        return "derived"
    return f"derived from ctx {ctx[0]} and {ctx[1]} (checked at ctx {ctx[2]})"


def sweep_frame(table: pd.DataFrame | Sequence[Any]) -> pd.DataFrame:
    """The finished points of a sweep table (a DataFrame, or ``SweepRow`` s) with a ``line`` label per series."""
    if not isinstance(table, pd.DataFrame):
        table = pd.DataFrame.from_records([r.record() for r in table])
    if table.empty:
        return pd.DataFrame(columns=list(SWEEP_COLUMNS))
    ok = table[table["status"].isin(FINISHED)].copy()
    if "phase" not in ok.columns:
        ok["phase"] = "decode"
    if "derived_from_ctx" not in ok.columns:  # a table from before derived points
        ok["derived_from_ctx"] = ""
    ok["derived_from_ctx"] = ok["derived_from_ctx"].fillna("").astype(str)
    ok["provenance"] = [provenance(s, d) for s, d in zip(ok["status"], ok["derived_from_ctx"], strict=True)]
    ok["line"] = [f"{m} · {v} · {c}" + ("" if p == "decode" else f" · {p} (prompt tok/s)")
                  for m, v, c, p in zip(ok["model"], ok["variant"], ok["compression"], ok["phase"], strict=True)]
    for col in SWEEP_COLUMNS:
        if col not in ok.columns:
            ok[col] = None
    out = ok[list(SWEEP_COLUMNS)].sort_values(["line", "ctx"]).reset_index(drop=True)
    out["ctx"] = out["ctx"].astype("int64")
    for col in ("bytes_total", "bytes_kv_read", "bytes_replication", "bytes_weights", "tile_count"):
        out[col] = pd.to_numeric(out[col], errors="coerce").astype("Int64")
    out["predicted_tok_per_s"] = pd.to_numeric(out["predicted_tok_per_s"], errors="coerce").astype("float64")
    return out


def measured_frame(measurements: Sequence[Any]) -> pd.DataFrame:
    """Measured log rows that have a context length, averaged per condition as seconds per token."""

    rows = [{"device": o.device, "build": o.build, "context_length": o.context_length, "n_runs": o.n_runs,
             "tok_per_s": o.tok_per_s}
            for o in observations_from(measurements) if o.context_length is not None]
    return pd.DataFrame.from_records(rows, columns=list(MEASURED_COLUMNS))


def _lines(fig: go.Figure, frame: pd.DataFrame, y: str, scale: float, hover: str) -> None:
    """One line per series; a derived point is an open marker, and every hover says where the point came from."""
    for i, line in enumerate(dict.fromkeys(frame["line"])):
        part = frame[frame["line"] == line]
        variant = str(part["variant"].iloc[0])
        fig.add_scatter(x=list(part["ctx"]), y=[float(v) / scale for v in part[y]], mode="lines+markers",
                        name=fmt.plot_text(line),
                        line={"dash": DASH.get(variant, "dot"), "color": DEVICE_COLORS[i % len(DEVICE_COLORS)]},
                        marker={"symbol": ["circle-open" if s == "derived" else "circle" for s in part["status"]],
                                "size": 8},
                        customdata=list(part["provenance"]),
                        hovertemplate="ctx %{x}<br>" + hover + "<br>%{customdata}<extra>" + line + "</extra>")
    if (frame["status"] == "derived").any():  # a legend entry that says what an open marker is
        fig.add_scatter(x=[None], y=[None], mode="markers", name=DERIVED_LEGEND, hoverinfo="skip",
                        marker={"symbol": "circle-open", "size": 8, "color": "gray"})


def _log_axes(fig: go.Figure, y_title: str, values: Sequence[float]) -> None:
    ctx = [float(x) for trace in fig.data for x in (trace.x or ()) if x is not None]
    fig.update_xaxes(**log_axis(ctx, "context length (KV cache slots, log)"))
    fig.update_yaxes(**log_axis(values, y_title))


def tok_per_s_figure(frame: pd.DataFrame, measured: pd.DataFrame | None = None, profile_label: str = "") -> go.Figure:
    """Predicted tok/s vs ctx per series (tok/s = BW ÷ bytes per token), measured log points overlaid."""
    fig = go.Figure()
    _lines(fig, frame, "predicted_tok_per_s", 1.0, "%{y:.2f} tok/s predicted")
    values = [float(v) for v in frame["predicted_tok_per_s"].dropna()]
    if measured is not None and len(measured):
        for j, (device, build) in enumerate(dict.fromkeys(zip(measured["device"], measured["build"], strict=True))):
            part = measured[(measured["device"] == device) & (measured["build"] == build)]
            values += [float(v) for v in part["tok_per_s"]]
            fig.add_scatter(x=list(part["context_length"]), y=list(part["tok_per_s"]), mode="markers",
                            name=fmt.plot_text(f"measured: {device} · {build}"),  # the logs' text
                            marker={"size": 10, "symbol": "diamond", "color": DEVICE_COLORS[-1 - j % 4]},
                            hovertemplate="ctx %{x}<br>%{y:.2f} tok/s measured<extra>" + fmt.plot_text(build)
                                          + "</extra>")
    _log_axes(fig, "tok/s (log)", values)
    title = "Predicted tok/s vs context length" + (f" at {profile_label}" if profile_label else "")
    return style(fig, title + "; measured ◆", height=480)


def bytes_figure(frame: pd.DataFrame) -> go.Figure:
    """Logical bytes per decode token vs ctx per series (MB = 10^6 bytes)."""
    fig = go.Figure()
    _lines(fig, frame, "bytes_total", MB, "%{y:,.1f} MB per token")
    _log_axes(fig, "bytes per token (MB = 10^6 B, log)", [float(v) / MB for v in frame["bytes_total"].dropna()])
    return style(fig, "Bytes per decode token vs context length", height=440)


def progress_frame(rows: Sequence[Any]) -> pd.DataFrame:
    """Live rows while a sweep runs: the point, its status and what it is doing."""
    return pd.DataFrame.from_records(
        [{"model": r.point.model, "compression": r.point.compression, "variant": r.point.variant,
          "ctx": r.point.ctx, "status": r.status, "derived_from_ctx": r.derived_from_text, "stage": r.stage,
          "seconds": round(r.seconds, 1), "error": r.error} for r in rows],
        columns=["model", "compression", "variant", "ctx", "status", "derived_from_ctx", "stage", "seconds", "error"])
