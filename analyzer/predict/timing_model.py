"""A device model fitted on logs that span ctx, compression and builds, and which graph explains them better.

The model, per device (seconds per decode token):

    t = Σ_c bytes_c / BW_c  +  n_ops · τ  +  t0          c ∈ weights, kv_read, replication, kv_write, activations

is linear in its coefficients (1/BW_c, τ, t0), so it is solved by least squares on time, weighted by 1/t² (errors
relative to the time, which is how run-to-run noise behaves). What a set of logs can identify depends on the
sweep, so the terms are chosen, not assumed:

1. A term whose column is 0 in every row is **absent** (e.g. replication for Q-fold graphs).
2. Terms are tried in ``TERM_ORDER``; a term whose (weighted, scaled) column lies in the span of the terms kept
   before it — relative residual below ``tol`` — is **not identifiable**. When the span that explains it includes
   a byte term, its bytes are **pooled** into the byte term that explains most of it (they share one bandwidth,
   e.g. replication ∝ kv_read when every build is repeat_kv); otherwise (a constant: kv_write, or n_ops when every
   row is one variant) its time is **absorbed** into t0. Either way the report says so; nothing is dropped
   silently.
3. The kept design matrix's rank, condition number and singular values are reported; standard errors come from
   the least-squares covariance s²(XᵀWX)⁻¹ (bandwidths by the delta method, se(BW) = se(1/BW)·BW²).

Held-out error is leave-one-out, exact for a linear fit: e_i / (1 − h_ii) with h the hat matrix's diagonal, as a
relative error of the time per token. Model selection compares candidate graphs per row (e.g. the repeat_kv and
the Q-fold analysis at each ctx) by that error under each term set in ``TERM_SETS``. Telling repeat_kv from Q-fold
needs the KV bytes to share a bandwidth with bytes the logs pin down otherwise (the weights, varied by compression):
with a free KV bandwidth, copies ∝ ctx look exactly like slower KV reads, and the comparison says the graphs
"cannot be told apart" (their design matrices span the same space) instead of picking one.

Units: bytes, seconds, bytes/s inside; MB = 10^6 bytes at the edge.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from analyzer.analysis.accounting import CATEGORIES

TermKind = Literal["bytes", "ops", "intercept"]
TermStatus = Literal["fitted", "absent", "not identifiable"]

DEFAULT_TOL = 1e-6
"""Relative residual of a term's scaled column after projection on the kept terms below which it is not
identifiable: a variance inflation of 10^12, i.e. numerically collinear. Near-collinear terms above it are fitted
and show it in their standard error and the condition number."""
POORLY_DETERMINED_REL_SE = 0.5
"""A fitted coefficient whose standard error exceeds half its value is flagged as poorly determined."""


@dataclass(frozen=True, slots=True)
class Term:
    """One column of the design: bytes of some categories (coefficient 1/BW), the op count (τ) or 1 (t0)."""

    name: str
    kind: TermKind
    categories: tuple[str, ...] = ()


T0 = Term("t0", "intercept")
OPS = Term("ops", "ops")
# The order terms are tried in: what is kept first explains the rest. t0 and the weights come first (every decode
# step has a fixed cost and streams its weights), then the KV stream, the copies, the dispatch cost per op, and the
# bytes that are most often absorbed by caches (kv_write's one slot, the activations).
PER_CATEGORY: tuple[Term, ...] = (T0, Term("weights", "bytes", ("weights",)), Term("kv_read", "bytes", ("kv_read",)),
                                  Term("replication", "bytes", ("replication",)), OPS,
                                  Term("kv_write", "bytes", ("kv_write",)),
                                  Term("activations", "bytes", ("activations",)))
SHARED: tuple[Term, ...] = (T0, Term("bytes", "bytes", CATEGORIES), OPS)
TERM_SETS: Mapping[str, tuple[Term, ...]] = {"per-category": PER_CATEGORY, "shared": SHARED}
"""Named term sets: every category its own bandwidth (pooled where the logs cannot tell them apart), or one
bandwidth for all bytes (what tells graphs with and without KV copies apart)."""
TERM_ORDER: tuple[str, ...] = tuple(t.name for t in PER_CATEGORY)


@dataclass(frozen=True, slots=True)
class GraphPoint:
    """What one candidate graph says a measured row moved per decode token."""

    label: str
    bytes: tuple[tuple[str, int], ...]  # (category, bytes per token)
    n_ops: int  # non-const ops per decode step
    ctx: int | None = None

    def bytes_of(self, categories: Sequence[str]) -> int:
        d = dict(self.bytes)
        return sum(int(d.get(c, 0)) for c in categories)


@dataclass(frozen=True, slots=True)
class Observation:
    """One measured condition on one device: runs averaged as seconds per token (the model is linear in time)."""

    device: str
    build: str
    seconds_per_token: float
    n_runs: int = 1
    context_length: int | None = None
    source: str = ""  # file:lines the runs came from

    @property
    def tok_per_s(self) -> float:
        return 1.0 / self.seconds_per_token


@dataclass(frozen=True, slots=True)
class TermEstimate:
    """A fitted term: its coefficient (s/byte, s/op or s) with standard error, and the same as a physical value
    (bandwidth in bytes/s, τ in s/op, t0 in s). ``pooled`` names categories whose bytes share this bandwidth."""

    name: str
    kind: TermKind
    categories: tuple[str, ...]
    coefficient: float
    coefficient_se: float
    value: float
    value_se: float
    physical: bool
    poorly_determined: bool

    @property
    def unit(self) -> str:
        return {"bytes": "bytes/s", "ops": "s/op", "intercept": "s"}[self.kind]


@dataclass(frozen=True, slots=True)
class TermNote:
    """A term that is not fitted on its own, and why."""

    name: str
    status: TermStatus
    reason: str
    into: str = ""  # the term that carries it (pooled bytes or absorbed time), "" when absent


@dataclass(frozen=True, slots=True)
class PointResidual:
    build: str
    graph: str
    context_length: int | None
    n_runs: int
    measured_s: float
    fitted_s: float
    measured_tok_per_s: float
    fitted_tok_per_s: float
    residual_pct: float  # (measured − fitted) / measured time × 100
    loo_residual_pct: float  # the same with the point left out of the fit
    leverage: float


@dataclass(frozen=True, slots=True)
class DeviceModelFit:
    device: str
    hypothesis: str
    term_set: str
    terms: tuple[TermEstimate, ...]
    notes: tuple[TermNote, ...]
    n_points: int
    rank: int
    degrees_of_freedom: int
    condition_number: float
    singular_values: tuple[float, ...]
    residuals: tuple[PointResidual, ...]
    rms_residual_pct: float
    loo_rms_pct: float  # held-out: leave-one-out RMS relative error of the time per token
    sigma_pct: float  # estimated relative noise per point (√(RSS/dof)), NaN without degrees of freedom
    r_squared: float | None
    verdict: str

    def term(self, name: str) -> TermEstimate:
        for t in self.terms:
            if t.name == name:
                return t
        raise KeyError(f"{name!r} is not a fitted term of this fit ({', '.join(t.name for t in self.terms)})")

    @property
    def physical(self) -> bool:
        return all(t.physical for t in self.terms)

    def predict_seconds(self, graph: GraphPoint) -> float:
        total = 0.0
        for t in self.terms:
            x = 1.0 if t.kind == "intercept" else graph.n_ops if t.kind == "ops" else graph.bytes_of(t.categories)
            total += t.coefficient * x
        return total


# ------------------------------------------------------------------------------------------------- the fit
def term_column(term: Term, graphs: Sequence[GraphPoint]) -> np.ndarray:
    if term.kind == "intercept":
        return np.ones(len(graphs))
    if term.kind == "ops":
        return np.array([g.n_ops for g in graphs], dtype=np.float64)
    return np.array([g.bytes_of(term.categories) for g in graphs], dtype=np.float64)


def unit_scale(v: np.ndarray) -> tuple[np.ndarray, float]:
    norm = float(np.linalg.norm(v))
    return (v / norm if norm > 0 else v), norm


def identify(terms: Sequence[Term], graphs: Sequence[GraphPoint], weights: np.ndarray,
             tol: float = DEFAULT_TOL) -> tuple[list[Term], list[TermNote]]:
    """Keep the terms the rows can tell apart (in the given order), pool or absorb the rest; see the module doc."""
    kept: list[Term] = []
    notes: list[TermNote] = []
    raw: dict[str, np.ndarray] = {}
    for term in terms:
        col = term_column(term, graphs)
        if not np.any(col):
            notes.append(TermNote(term.name, "absent", "0 in every row"))
            continue
        unit, _ = unit_scale(col * weights)
        if kept:
            basis = np.stack([unit_scale(raw[k.name] * weights)[0] for k in kept], axis=1)
            coef, *_ = np.linalg.lstsq(basis, unit, rcond=None)
            residual = float(np.linalg.norm(unit - basis @ coef))
        else:
            coef, residual = np.zeros(0), 1.0
        if residual >= tol and len(kept) < len(graphs):
            kept.append(term)
            raw[term.name] = col
            continue
        share = {k.name: abs(float(c)) for k, c in zip(kept, coef, strict=True)}
        byte_terms = [k for k in kept if k.kind == "bytes"]
        partners = " + ".join(n for n, s in sorted(share.items(), key=lambda kv: -kv[1]) if s > 1e-9) or "nothing"
        if len(kept) >= len(graphs) and residual >= tol:
            reason = f"{len(graphs)} rows leave no room for another term"
        else:
            reason = f"its column is a combination of {partners} in these rows"
        if term.kind == "bytes" and byte_terms and max(share[k.name] for k in byte_terms) > 1e-9:
            into = max(byte_terms, key=lambda k: share[k.name])
            i = kept.index(into)
            kept[i] = Term(into.name, "bytes", into.categories + term.categories)
            raw[into.name] = raw[into.name] + col
            notes.append(TermNote(term.name, "not identifiable", f"{reason}: pooled (same bandwidth)", into.name))
        else:
            into_name = "t0" if any(k.kind == "intercept" for k in kept) else ""
            notes.append(TermNote(term.name, "not identifiable",
                                  f"{reason}: its time is absorbed" + (" into t0" if into_name else ""), into_name))
    return kept, notes


def fit_device_model(observations: Sequence[Observation], graphs: Sequence[GraphPoint], *, device: str = "",
                     hypothesis: str = "as mapped", term_set: str = "per-category",
                     tol: float = DEFAULT_TOL) -> DeviceModelFit:
    """Fit the device model on ``observations[i]`` measured with ``graphs[i]`` (same length, one device)."""
    if len(observations) != len(graphs):
        raise ValueError(f"{len(observations)} observations but {len(graphs)} graphs: one graph per observation")
    if not observations:
        raise ValueError(f"no observations with a graph to fit on {device!r}")
    terms = TERM_SETS[term_set]
    t = np.array([o.seconds_per_token for o in observations], dtype=np.float64)
    if not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("every seconds_per_token must be a finite number > 0")
    w = 1.0 / t  # relative errors: each row's residual in units of its own time
    kept, notes = identify(terms, graphs, w, tol)
    raw = np.stack([term_column(k, graphs) for k in kept], axis=1)  # (n, p)
    scales = np.linalg.norm(raw * w[:, None], axis=0)
    design = raw * w[:, None] / scales  # weighted, unit columns
    y = t * w  # = 1
    coef_scaled, *_ = np.linalg.lstsq(design, y, rcond=None)
    n, p = design.shape
    singular = np.linalg.svd(design, compute_uv=False)
    rank = int(np.sum(singular > singular[0] * 1e-12)) if singular.size else 0
    cond = float(singular[0] / singular[-1]) if singular.size and singular[-1] > 0 else math.inf
    fitted_w = design @ coef_scaled
    resid = y - fitted_w  # relative residuals of the time
    dof = n - p
    rss = float(resid @ resid)
    sigma2 = rss / dof if dof > 0 else math.nan
    gram_inv = np.linalg.pinv(design.T @ design)
    cov_scaled = sigma2 * gram_inv
    coef = coef_scaled / scales
    se = np.sqrt(np.clip(np.diag(cov_scaled), 0, None)) / scales if dof > 0 else np.full(p, math.nan)
    hat = np.einsum("ij,jk,ik->i", design, gram_inv, design)
    with np.errstate(divide="ignore", invalid="ignore"):
        loo = np.where(hat < 1 - 1e-9, resid / (1 - hat), math.inf)
    estimates = tuple(_estimate(k, float(c), float(s)) for k, c, s in zip(kept, coef, se, strict=True))
    fitted_t = fitted_w / w
    residuals = tuple(
        PointResidual(o.build, g.label, o.context_length, o.n_runs, float(ti), float(fi), 1.0 / ti,
                      1.0 / fi if fi > 0 else math.inf, 100.0 * float(r), 100.0 * float(lo), float(h))
        for o, g, ti, fi, r, lo, h in zip(observations, graphs, t, fitted_t, resid, loo, hat, strict=True))
    rms = 100.0 * math.sqrt(rss / n)
    loo_rms = 100.0 * math.sqrt(float(np.mean(loo**2))) if np.all(np.isfinite(loo)) else math.inf
    ss_tot = float(np.sum((t - t.mean()) ** 2))
    r2 = 1.0 - float(np.sum((t - fitted_t) ** 2)) / ss_tot if ss_tot > 0 else None
    fit = DeviceModelFit(device, hypothesis, term_set, estimates, tuple(notes), n, rank, dof, cond,
                         tuple(float(s) for s in singular), residuals, rms, loo_rms,
                         100.0 * math.sqrt(sigma2) if dof > 0 else math.nan, r2, "")
    return _with_verdict(fit)


def _estimate(term: Term, c: float, s: float) -> TermEstimate:
    if term.kind == "bytes":
        value = 1.0 / c if c != 0 else math.inf
        value_se = s / (c * c) if c != 0 else math.inf
        physical = c > 0
    else:
        value, value_se = c, s
        physical = c >= -3 * s if math.isfinite(s) else c >= 0  # a cost may be 0 within its error, not below
    poorly = math.isfinite(s) and c != 0 and s > POORLY_DETERMINED_REL_SE * abs(c)
    return TermEstimate(term.name, term.kind, term.categories, c, s, value, value_se, physical, poorly)


def describe_term(t: TermEstimate) -> str:
    """``weights: 60.0 ± 0.4 GB/s`` — at the edge, GB = 10^9 bytes."""
    if t.kind == "bytes":
        pooled = f" [{' + '.join(t.categories)}]" if len(t.categories) > 1 else ""
        if not t.physical:
            return f"{t.name}{pooled}: non-physical (1/BW = {t.coefficient:.3g} s/byte)"
        return f"{t.name}{pooled}: {t.value / 1e9:,.2f} ± {t.value_se / 1e9:,.2f} GB/s"
    if t.kind == "ops":
        return f"τ per op: {t.value * 1e6:,.3f} ± {t.value_se * 1e6:,.3f} µs"
    return f"t0: {t.value * 1e3:,.3f} ± {t.value_se * 1e3:,.3f} ms"


def _with_verdict(fit: DeviceModelFit) -> DeviceModelFit:
    parts = [f"{fit.n_points} points, {len(fit.terms)} terms ({', '.join(t.name for t in fit.terms)}), "
             f"{fit.degrees_of_freedom} degrees of freedom"]
    if fit.degrees_of_freedom < 1:
        parts.append("the fit passes through every point: no held-out error, no uncertainty")
    else:
        parts.append(f"RMS error {fit.rms_residual_pct:.2f}%, leave-one-out {fit.loo_rms_pct:.2f}%")
    bad = [t.name for t in fit.terms if not t.physical]
    if bad:
        parts.append(f"non-physical: {', '.join(bad)}")
    poor = [t.name for t in fit.terms if t.poorly_determined]
    if poor:
        parts.append(f"poorly determined (se > {POORLY_DETERMINED_REL_SE:.0%}): {', '.join(poor)}")
    unid = [n.name for n in fit.notes if n.status == "not identifiable"]
    if unid:
        parts.append(f"not identifiable from these logs: {', '.join(unid)}")
    return replace(fit, verdict="; ".join(parts))
