"""Which candidate graph explains a device's measurements better: the device model fitted under each
hypothesis, compared by leave-one-out error (analyzer.predict.timing_model explains when graphs cannot be told
apart)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from analyzer.predict.timing_model import (
    DEFAULT_TOL,
    DeviceModelFit,
    GraphPoint,
    Observation,
    Term,
    fit_device_model,
    term_column,
    unit_scale,
)


@dataclass(frozen=True, slots=True)
class Comparison:
    """Hypotheses compared under one term set: their fits, the winner by held-out error, and by how much."""

    term_set: str
    fits: tuple[DeviceModelFit, ...]
    best: str | None
    runner_up: str | None
    margin: float | None  # runner-up's LOO error ÷ the best's (× better)
    indistinguishable: tuple[tuple[str, str], ...]
    verdict: str


@dataclass(frozen=True, slots=True)
class Selection:
    device: str
    comparisons: tuple[Comparison, ...]
    best: str | None
    verdict: str


def _span_rank(matrix: np.ndarray) -> int:
    if matrix.size == 0:
        return 0
    s = np.linalg.svd(matrix, compute_uv=False)
    return int(np.sum(s > s[0] * 1e-9)) if s.size and s[0] > 0 else 0


def _kept_matrix(fit: DeviceModelFit, graphs: Sequence[GraphPoint], w: np.ndarray) -> np.ndarray:
    cols = [term_column(Term(t.name, t.kind, t.categories), graphs) * w for t in fit.terms]
    return np.stack([unit_scale(c)[0] for c in cols], axis=1)


def select_graphs(observations: Sequence[Observation], candidates: Mapping[str, Sequence[GraphPoint]], *,
                  device: str = "", term_sets: Sequence[str] = ("shared", "per-category"),
                  tol: float = DEFAULT_TOL) -> Selection:
    """Which candidate graph per row explains the measurements better, by leave-one-out error, per term set."""
    if len(candidates) < 2:
        raise ValueError("model selection needs at least two hypotheses (candidate graphs per row)")
    t = np.array([o.seconds_per_token for o in observations], dtype=np.float64)
    w = 1.0 / t
    comparisons = []
    for term_set in term_sets:
        fits = {h: fit_device_model(observations, g, device=device, hypothesis=h, term_set=term_set, tol=tol)
                for h, g in candidates.items()}
        mats = {h: _kept_matrix(f, candidates[h], w) for h, f in fits.items()}
        same = []
        names = list(fits)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                ra, rb = _span_rank(mats[a]), _span_rank(mats[b])
                if ra == rb == _span_rank(np.concatenate([mats[a], mats[b]], axis=1)):
                    same.append((a, b))
        ranked = sorted(names, key=lambda h: fits[h].loo_rms_pct)
        best, runner = ranked[0], ranked[1]
        lb, lr = fits[best].loo_rms_pct, fits[runner].loo_rms_pct
        margin = lr / lb if lb > 0 and math.isfinite(lr) else (math.inf if lb == 0 and lr > 0 else None)
        if (best, runner) in same or (runner, best) in same:
            verdict = (f"{term_set}: {best} and {runner} cannot be told apart (their design matrices span the same "
                       "space; with these terms the logs fit both equally)")
            best_out = None
        elif not math.isfinite(lb):
            verdict = f"{term_set}: no held-out error (a point alone determines a term); add measurements"
            best_out = None
        else:
            verdict = (f"{term_set}: {best} explains the measurements better — leave-one-out error {lb:.2f}% vs "
                       f"{lr:.2f}% for {runner}" + (f" ({margin:.1f}× lower)" if margin and math.isfinite(margin)
                                                     else ""))
            best_out = best
        comparisons.append(Comparison(term_set, tuple(fits.values()), best_out, runner, margin, tuple(same),
                                      verdict))
    decided = [c for c in comparisons if c.best is not None]
    if not decided:
        return Selection(device, tuple(comparisons), None,
                         "no term set tells the candidate graphs apart on these logs; vary the compression as well "
                         "as ctx so the weights pin the bandwidth the KV bytes share")
    top = min(decided, key=lambda c: min(f.loo_rms_pct for f in c.fits))
    return Selection(device, tuple(comparisons), top.best, top.verdict)
