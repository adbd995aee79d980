"""The same A/B on the other backend: a Core ML repeat_kv/qfold pair and the Core AI pair of one model and spec
(model, overrides, KV mode, ctx, compression, phase), side by side — what the A/B page shows under its headline.

:func:`backend_twin` finds the other backend's pair among the analyses the dashboard knows (the build mode and the
weights dtype may differ: a Core ML build is fp16 whatever its torch weights, a Core AI build is materialised by
default); :func:`twin_frame` sets the four analyses' bytes per decode token by category in one table (ints, bytes;
each pair's qfold − repeat_kv beside it) and :func:`twin_figure` draws exactly that table.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from analyzer.analysis.accounting import CATEGORIES
from analyzer.analysis.record import Analysis
from analyzer.fmt import MIB
from analyzer.report.catalog import AnalysisRef, matching_pair
from analyzer.report.figures import style

BACKEND_NAMES = {"coreml": "Core ML", "coreai": "Core AI"}
_COLORS = {("coreml", 0): "#4C78A8", ("coreml", 1): "#9ECAE9", ("coreai", 0): "#F58518", ("coreai", 1): "#FFBF79"}


def _key(ref: AnalysisRef) -> tuple | None:
    f = ref.facts
    if f is None:
        return None
    return (f.model, dict(ref.spec).get("overrides", ()), f.kv_mode, f.ctx, f.compression, f.phase, f.q_len, f.size)


def backend_twin(pair: tuple[AnalysisRef, AnalysisRef],
                 refs: Sequence[AnalysisRef]) -> tuple[AnalysisRef, AnalysisRef] | None:
    """The (repeat_kv, qfold) pair of the same model and spec on the other backend, or None: when ``pair`` is not
    one backend's matching pair, or the other backend has no such pair (a shipped or cached analysis of each)."""
    a, b = pair
    if a.facts is None or b.facts is None or a.facts.backend != b.facts.backend or _key(a) != _key(b):
        return None
    if matching_pair(a, refs) not in ((a, b), (b, a)):
        return None
    for other in (r for r in refs if r.facts and r.facts.backend != a.facts.backend and _key(r) == _key(a)
                  and r.variant == a.variant):
        twin = matching_pair(other, refs)
        if twin is not None:
            return twin
    return None


def twin_frame(analyses: dict[tuple[str, str], Analysis]) -> pd.DataFrame:
    """Bytes per decode token by category (and ``total``) of the four analyses, keyed (backend, variant): one
    column per analysis (``coreml_repeat_kv`` …) and per backend ``<backend>_delta`` (qfold − repeat_kv)."""
    rows = []
    for category in (*CATEGORIES, "total"):
        row: dict = {"category": category}
        for backend in BACKEND_NAMES:
            for variant in ("repeat_kv", "qfold"):
                a = analyses.get((backend, variant))
                row[f"{backend}_{variant}"] = a.bytes_per_token.get(category) if a is not None else None
            base, cand = row[f"{backend}_repeat_kv"], row[f"{backend}_qfold"]
            row[f"{backend}_delta"] = cand - base if base is not None and cand is not None else None
        rows.append(row)
    return pd.DataFrame(rows)


def twin_figure(frame: pd.DataFrame, spec_text: str) -> go.Figure:
    """Grouped bars: per category, Core ML repeat_kv and qfold, then Core AI repeat_kv and qfold (MiB per token)."""
    fig = go.Figure()
    cats = frame[frame["category"] != "total"]
    for backend, name in BACKEND_NAMES.items():
        for i, variant in enumerate(("repeat_kv", "qfold")):
            col = f"{backend}_{variant}"
            fig.add_bar(x=cats["category"], y=[None if v is None else v / MIB for v in cats[col]],
                        name=f"{name} · {variant}", marker_color=_COLORS[(backend, i)],
                        hovertemplate="%{x}: %{y:,.1f} MiB<extra>" + f"{name} · {variant}" + "</extra>")
    fig.update_layout(barmode="group", yaxis_title="MiB per decode token")
    return style(fig, f"The same A/B on both backends ({spec_text})")
