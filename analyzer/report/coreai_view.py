"""The dashboard's Core AI actions over the catalog: which analyses have an asset on this server to fold or to time
on the Core AI runtime, what each is called, and a bench result as the table the Builds page shows.

An analysis has an asset when it is a materialised Core AI build (its folder keeps ``model.aimodel``) or an
``.aimodel`` analysed on the Builds page (a fold's output included); analysis-mode builds keep none (their weights
have no values) and shipped analyses carry no model.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from analyzer.convert.launch import ASSET_NAME
from analyzer.fold.cache import fold_record_of
from analyzer.ir.coreai.asset import looks_like_asset
from analyzer.measure.bench import BenchResult
from analyzer.model.backends import COREAI
from analyzer.report.catalog import CANDIDATE_VARIANT, AnalysisRef


def asset_of(ref: AnalysisRef) -> Path | None:
    """The ``.aimodel`` on this server that ``ref`` is the analysis of, or None."""
    if ref.kind == "package" and looks_like_asset(ref.path):
        return Path(ref.path)
    if ref.kind == "build" and ref.facts is not None and ref.facts.backend == COREAI and \
            (Path(ref.path) / ASSET_NAME).is_dir():
        return Path(ref.path) / ASSET_NAME
    return None


def bench_targets(refs: Sequence[AnalysisRef]) -> list[AnalysisRef]:
    """Every analysis the Core AI runtime can time here: one with an asset, decode steps (bench times decode)."""
    return [r for r in refs if asset_of(r) is not None and r.phase == "decode"]


def fold_targets(refs: Sequence[AnalysisRef]) -> list[AnalysisRef]:
    """The Core AI analyses a fold may change: those with an asset, neither a Q-fold build (nothing to fold) nor a
    fold's own output."""
    return [r for r in refs if (asset := asset_of(r)) is not None and r.variant != CANDIDATE_VARIANT
            and fold_record_of(asset) is None]


def bench_frame(result: BenchResult) -> pd.DataFrame:
    """One row per target: decode tok/s (median and the slowest and fastest round), ms per token and its ratio to
    the first target with the interval the rounds give (``measure.bench.RATIO_METHOD``), its peak memory on the
    runtime (``MEMORY_METHOD``; empty where not measured), and where the profiled time went by byte category."""
    base = result.targets[0].ms_per_token_median
    rows = []
    for t in result.targets:
        by = sorted(((k, v) for k, v in t.time_by_category_ms.items() if v > 0), key=lambda kv: -kv[1])
        rows.append({"build": t.label, "weights": t.weights_dtype, "ctx": t.context_length,
                     "tok/s (median)": t.tok_per_s_median, "tok/s (slowest round)": min(t.tok_per_s),
                     "tok/s (fastest round)": max(t.tok_per_s), "ms per token": t.ms_per_token_median,
                     "× first": t.ms_per_token_median / base,
                     "× first, CI low": None if t.ratio is None else t.ratio.low,
                     "× first, CI high": None if t.ratio is None else t.ratio.high,
                     "CI level": None if t.ratio is None else t.ratio.level,
                     "peak memory (bytes)": None if t.memory is None else t.memory.peak_bytes,
                     "profiled ms per token by category": ", ".join(f"{k} {v:.2f}" for k, v in by)})
    return pd.DataFrame(rows)
