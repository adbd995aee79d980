"""The Sweeps page's numbers and charts: pure functions (frame in, plotly figure out), no streamlit.

As in ``analyzer.report.figures``, each chart draws exactly the frame that is shown and downloaded beside it:
``sweep_frame`` holds one row per finished point (bytes stay ints), ``measured_frame`` one row per measured
condition (runs averaged as seconds per token). Both charts have log axes and name their units; one line per
(model, variant, compression), measured points as markers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from analyzer.fmt import MB
from analyzer.report.figures import DEVICE_COLORS, style

SWEEP_COLUMNS: tuple[str, ...] = ("line", "model", "variant", "compression", "ctx", "status", "tile_count",
                                  "bytes_total", "bytes_kv_read", "bytes_replication", "bytes_weights",
                                  "predicted_tok_per_s", "device_profile", "key")
MEASURED_COLUMNS: tuple[str, ...] = ("device", "build", "context_length", "n_runs", "tok_per_s")
DASH = {"repeat_kv": "solid", "qfold": "dash"}


def sweep_frame(table: pd.DataFrame | Sequence[Any]) -> pd.DataFrame:
    """The finished points of a sweep table (a DataFrame, or ``SweepRow`` s) with a ``line`` label per series."""
    if not isinstance(table, pd.DataFrame):
        table = pd.DataFrame.from_records([r.record() for r in table])
    if table.empty:
        return pd.DataFrame(columns=list(SWEEP_COLUMNS))
    ok = table[table["status"].isin(["built", "reused"])].copy()
    ok["line"] = [f"{m} · {v} · {c}" for m, v, c in zip(ok["model"], ok["variant"], ok["compression"], strict=True)]
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
    from analyzer.device.model_report import observations_from

    rows = [{"device": o.device, "build": o.build, "context_length": o.context_length, "n_runs": o.n_runs,
             "tok_per_s": o.tok_per_s}
            for o in observations_from(measurements) if o.context_length is not None]
    return pd.DataFrame.from_records(rows, columns=list(MEASURED_COLUMNS))


def _lines(fig: go.Figure, frame: pd.DataFrame, y: str, scale: float, hover: str) -> None:
    for i, line in enumerate(dict.fromkeys(frame["line"])):
        part = frame[frame["line"] == line]
        variant = str(part["variant"].iloc[0])
        fig.add_scatter(x=list(part["ctx"]), y=[float(v) / scale for v in part[y]], mode="lines+markers", name=line,
                        line={"dash": DASH.get(variant, "dot"), "color": DEVICE_COLORS[i % len(DEVICE_COLORS)]},
                        hovertemplate="ctx %{x}<br>" + hover + "<extra>" + line + "</extra>")


def _log_axes(fig: go.Figure, y_title: str, values: Sequence[float]) -> None:
    fig.update_xaxes(type="log", title_text="context length (KV cache slots, log)")
    finite = [v for v in values if v and math.isfinite(v) and v > 0]
    if finite:
        fig.update_yaxes(type="log", title_text=y_title,
                         range=[math.log10(min(finite) / 1.5), math.log10(max(finite) * 1.5)])
    else:
        fig.update_yaxes(type="log", title_text=y_title)


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
                            name=f"measured: {device} · {build}",
                            marker={"size": 10, "symbol": "diamond", "color": DEVICE_COLORS[-1 - j % 4]},
                            hovertemplate="ctx %{x}<br>%{y:.2f} tok/s measured<extra>" + build + "</extra>")
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
          "ctx": r.point.ctx, "status": r.status, "stage": r.stage, "seconds": round(r.seconds, 1),
          "error": r.error} for r in rows],
        columns=["model", "compression", "variant", "ctx", "status", "stage", "seconds", "error"])
