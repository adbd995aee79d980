"""Fit a bandwidth (and optionally a fixed per-token time) per device from its builds' measured tok/s and graph
bytes, and the one pipeline the ``fit`` command and the Bandwidth page both run: logs → per-(build, device)
statistics → fits → the bandwidth each device's predictions use → the cross-check (:func:`bandwidth_report`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from analyzer import fmt
from analyzer.measure.logs import BuildDeviceSummary, Measurement, summarize
from analyzer.predict.bandwidth_model import (
    BW_RANGE_BYTES_PER_S,
    DEFAULT_BANDWIDTH_PRESET,
    DEFAULT_MAX_RESIDUAL_PCT,
    BandwidthAssumption,
    BandwidthPreset,
    check_bytes,
    check_tok,
    fixed_assumption,
    preset_assumption,
)
from analyzer.predict.crosscheck import CrossCheckReport, crosscheck

FitModel = Literal["single-point", "bandwidth", "bandwidth+overhead"]
Weighting = Literal["build", "runs"]


@dataclass(frozen=True, slots=True)
class FitPoint:
    """One build's mean throughput on a device and its graph bytes/token."""

    build: str
    bytes_per_token: int
    tok_per_s: float
    n_runs: int = 1


@dataclass(frozen=True, slots=True)
class FitResidual:
    """How far a build's measured tok/s is from the fit: residual = measured − fitted,
    ``residual_pct`` relative to measured."""

    build: str
    bytes_per_token: int
    n_runs: int
    measured_tok_per_s: float
    fitted_tok_per_s: float
    residual_tok_per_s: float
    residual_pct: float


@dataclass(frozen=True, slots=True)
class BandwidthFit:
    """A fitted bandwidth (and overhead) for one device, with residuals and a plain verdict.

    ``degrees_of_freedom`` = points − parameters: at 0 the fit passes through every point and
    cannot show whether one bandwidth explains the builds. ``explains_builds`` is True only for a
    physical fit with at least one degree of freedom and every |residual| within the threshold.
    """

    device: str
    model: FitModel
    weighting: Weighting
    bw_bytes_per_s: float
    overhead_s: float
    n_points: int
    n_runs: int
    degrees_of_freedom: int
    residuals: tuple[FitResidual, ...]
    r_squared: float | None
    max_abs_residual_pct: float
    max_residual_pct_threshold: float
    physical: bool
    explains_builds: bool
    verdict: str
    unmapped_builds: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """Whether predictions may use this fit: a real fit (not one point) with physical values."""
        return self.model != "single-point" and self.physical

    def assumption(self) -> BandwidthAssumption:
        terms = "BW + per-token overhead" if self.model == "bandwidth+overhead" else "BW only"
        return BandwidthAssumption(
            self.bw_bytes_per_s, max(self.overhead_s, 0.0), "fit",
            f"fitted on {self.device} ({terms}, {self.n_points} builds, {self.weighting}-weighted)",
        )


def _mb_per_s(bw_bytes_per_s: float) -> str:
    return f"{fmt.bandwidth(bw_bytes_per_s)} (10^6 bytes/s)"


def fit_bandwidth(
    device: str,
    points: Sequence[FitPoint],
    *,
    overhead: bool = False,
    weighting: Weighting = "build",
    max_residual_pct: float = DEFAULT_MAX_RESIDUAL_PCT,
) -> BandwidthFit:
    """Least squares on time per token: t_i = bytes_i / BW (+ t0 with ``overhead``).

    Why time and not tok/s: the model is linear in time (t = bytes · (1/BW) + t0), so
    ``np.linalg.lstsq`` solves it exactly; tok/s residuals are reported because that is what was
    measured. Each point is one build's mean tok/s, t_i = 1 / mean.

    Weighting: ``"build"`` (default) gives every build one equal vote — the question is whether
    one bandwidth explains all builds, and weighting by run count would let a build benchmarked
    30 times outvote one benchmarked 3 times and hide its misfit. ``"runs"`` weights each build's
    squared residual by its run count n (as if every run were a point at its build's mean).
    Either way the residuals minimized are seconds, so a slow build (large t) pulls harder than
    a fast one; the verdict, though, judges every build by its relative tok/s residual.

    Fewer than 2 builds with distinct bytes/token cannot test the model: the result is the
    single-point implied BW (bytes × tok/s, averaged if several builds share the bytes), with a
    verdict saying a fit needs ≥ 2 builds with distinct bytes/token.
    """
    if not points:
        raise ValueError(f"no builds with graph bytes/token to fit on {device!r}")
    if weighting not in ("build", "runs"):
        raise ValueError(f"weighting must be 'build' or 'runs', got {weighting!r}")
    for p in points:
        check_bytes(p.bytes_per_token)
        check_tok(p.tok_per_s)
        if p.n_runs < 1:
            raise ValueError(f"build {p.build!r}: n_runs must be >= 1, got {p.n_runs}")
    x = np.array([p.bytes_per_token for p in points], dtype=np.float64)
    tok = np.array([p.tok_per_s for p in points], dtype=np.float64)
    runs = np.array([p.n_runs for p in points], dtype=np.float64)
    weights = np.ones_like(x) if weighting == "build" else runs
    t = 1.0 / tok
    distinct = len(set(x.tolist()))

    if distinct < 2:
        implied = float(np.average(x * tok, weights=weights))
        fitted_t = x / implied
        model: FitModel = "single-point"
        bw, t0, n_params = implied, 0.0, 1
    else:
        # Scale bytes to O(1) so both columns of the design matrix are comparable (bytes ~ 1e9).
        scale = float(x.max())
        columns = [x / scale] + ([np.ones_like(x)] if overhead else [])
        design = np.stack(columns, axis=1)  # (n_points, n_params)
        root_w = np.sqrt(weights)
        coef, *_ = np.linalg.lstsq(design * root_w[:, None], t * root_w, rcond=None)
        seconds_per_byte = float(coef[0]) / scale
        bw = 1.0 / seconds_per_byte if seconds_per_byte != 0 else math.inf
        t0 = float(coef[1]) if overhead else 0.0
        fitted_t = design @ coef
        model = "bandwidth+overhead" if overhead else "bandwidth"
        n_params = len(columns)

    with np.errstate(divide="ignore"):
        fitted_tok = np.where(fitted_t > 0, 1.0 / fitted_t, math.inf)
    residual = tok - fitted_tok
    residual_pct = 100.0 * residual / tok
    residuals = tuple(
        FitResidual(p.build, p.bytes_per_token, p.n_runs, p.tok_per_s, float(f), float(r), float(rp))
        for p, f, r, rp in zip(points, fitted_tok, residual, residual_pct, strict=True)
    )
    ss_tot = float(np.sum((tok - tok.mean()) ** 2))
    r_squared = None
    if ss_tot > 0 and np.all(np.isfinite(residual)):
        r_squared = 1.0 - float(np.sum(residual**2)) / ss_tot
    max_abs = float(np.max(np.abs(residual_pct)))
    # A t0 within 1e-9 of the mean time per token is numerical noise around 0, not a negative cost.
    tolerance_s = 1e-9 * float(t.mean())
    bw_ok = math.isfinite(bw) and bw > 0
    bw_in_range = bw_ok and BW_RANGE_BYTES_PER_S[0] <= bw <= BW_RANGE_BYTES_PER_S[1]
    t0_ok = t0 >= -tolerance_s
    physical = bw_in_range and t0_ok and bool(np.all(fitted_t > 0))
    dof = len(points) - n_params
    explains = model != "single-point" and physical and dof >= 1 and max_abs <= max_residual_pct

    overhead_text = f" + {t0 * 1e3:.3f} ms/token overhead" if model == "bandwidth+overhead" else ""
    if model == "single-point":
        if overhead:
            lead = "an overhead term needs ≥ 2 builds with distinct bytes/token"
        else:
            lead = "a fit needs ≥ 2 builds with distinct bytes/token"
        verdict = (f"{lead}; {device} has {len(points)} build(s) with {distinct} distinct value(s): "
                   f"the single point implies {_mb_per_s(bw)}, which does not test the model")
    elif not physical:
        reasons = []
        if not bw_ok:
            reasons.append("bandwidth ≤ 0 (builds with more bytes/token ran as fast or faster)")
        elif not bw_in_range:
            reasons.append(f"bandwidth {bw:g} bytes/s outside {BW_RANGE_BYTES_PER_S[0]:g} to "
                           f"{BW_RANGE_BYTES_PER_S[1]:g} bytes/s")
        if not t0_ok:
            reasons.append(f"negative per-token overhead ({t0 * 1e3:.3f} ms)")
        if bw_in_range and t0_ok:
            reasons.append("a fitted time per token ≤ 0")
        verdict = (f"one bandwidth does not explain these builds on {device}: the fit is non-physical "
                   f"({'; '.join(reasons)}); residuals up to {max_abs:.1f}%; the Neural Engine's "
                   "effective bandwidth may differ per graph")
    elif dof < 1:
        verdict = (f"{len(points)} builds and {n_params} parameters on {device}: the fit "
                   f"({_mb_per_s(bw)}{overhead_text}) passes through every point, so it cannot show "
                   "whether one bandwidth explains them; add a build with different bytes/token")
    elif max_abs > max_residual_pct:
        verdict = (f"one bandwidth does not explain these builds on {device}: residuals up to "
                   f"{max_abs:.1f}% (threshold {max_residual_pct:g}%); the Neural Engine's effective "
                   "bandwidth may differ per graph")
    else:
        verdict = (f"one bandwidth explains the {len(points)} builds on {device} within {max_abs:.1f}% "
                   f"(threshold {max_residual_pct:g}%): {_mb_per_s(bw)}{overhead_text}")
    return BandwidthFit(
        device=device,
        model=model,
        weighting=weighting,
        bw_bytes_per_s=bw,
        overhead_s=t0,
        n_points=len(points),
        n_runs=int(runs.sum()),
        degrees_of_freedom=dof,
        residuals=residuals,
        r_squared=r_squared,
        max_abs_residual_pct=max_abs,
        max_residual_pct_threshold=max_residual_pct,
        physical=physical,
        explains_builds=explains,
        verdict=verdict,
    )


def fit_devices(
    summaries: Sequence[BuildDeviceSummary],
    graph_bytes_per_token: Mapping[str, int],
    *,
    overhead: bool = False,
    weighting: Weighting = "build",
    max_residual_pct: float = DEFAULT_MAX_RESIDUAL_PCT,
) -> tuple[BandwidthFit, ...]:
    """One fit per device over its builds that have graph bytes; the rest are named in
    ``unmapped_builds``. Devices with no mapped build get no fit (crosscheck lists them)."""
    by_device: dict[str, list[BuildDeviceSummary]] = {}
    for s in summaries:
        by_device.setdefault(s.device, []).append(s)
    fits = []
    for device, group in sorted(by_device.items()):
        points = [FitPoint(s.build, graph_bytes_per_token[s.build], s.mean_tok_per_s, s.n)
                  for s in group if s.build in graph_bytes_per_token]
        if not points:
            continue
        fit = fit_bandwidth(device, points, overhead=overhead, weighting=weighting,
                            max_residual_pct=max_residual_pct)
        unmapped = tuple(sorted(s.build for s in group if s.build not in graph_bytes_per_token))
        fits.append(replace(fit, unmapped_builds=unmapped))
    return tuple(fits)


def bandwidth_per_device(
    devices: Sequence[str],
    fits: Sequence[BandwidthFit],
    *,
    fixed_bw_bytes_per_s: float | None = None,
    default: BandwidthPreset = DEFAULT_BANDWIDTH_PRESET,
) -> dict[str, BandwidthAssumption]:
    """The bandwidth each device's predictions use, and why.

    A fixed BW (the user's) wins, with no overhead; otherwise a device's usable fit (physical,
    ≥ 2 builds with distinct bytes); otherwise the default preset (the write-up's constant).
    """
    if fixed_bw_bytes_per_s is not None:
        fixed = fixed_assumption(fixed_bw_bytes_per_s)
        return dict.fromkeys(devices, fixed)
    usable = {f.device: f.assumption() for f in fits if f.usable}
    fallback = preset_assumption(default)
    return {d: usable.get(d, fallback) for d in devices}


@dataclass(frozen=True, slots=True)
class BandwidthReport:
    """Device logs held against graph bytes: statistics, fits, the bandwidth used per device, the cross-check."""

    summaries: tuple[BuildDeviceSummary, ...]
    fits: tuple[BandwidthFit, ...]
    bandwidth: dict[str, BandwidthAssumption]  # device → what its predictions use
    crosscheck: CrossCheckReport


def bandwidth_report(measurements: Sequence[Measurement], graph_bytes_per_token: Mapping[str, int], *,
                     fixed_bw_bytes_per_s: float | None = None, overhead: bool = False) -> BandwidthReport:
    """Per-(build, device) statistics of the accepted runs, a fit per device over its builds with graph bytes,
    the bandwidth each device's predictions use (``fixed_bw_bytes_per_s``, else a usable fit, else the
    write-up's constant) and every build and pair held against the graph."""
    summaries = tuple(summarize(measurements))
    fits = fit_devices(summaries, graph_bytes_per_token, overhead=overhead)
    devices = list(dict.fromkeys(s.device for s in summaries))
    bandwidth = bandwidth_per_device(devices, fits, fixed_bw_bytes_per_s=fixed_bw_bytes_per_s)
    return BandwidthReport(summaries, fits, bandwidth, crosscheck(summaries, graph_bytes_per_token, bandwidth))
