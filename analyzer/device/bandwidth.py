"""The bandwidth model ``tok/s ≈ BW ÷ bytes_per_token`` and its checks against measured throughput.

Why a model this simple: decode on a phone is memory-bound, so the time per token is roughly the
bytes a token moves divided by the bandwidth the backend achieves, plus a fixed cost (dispatch,
sampling) that does not scale with bytes:

    seconds_per_token = bytes_per_token / bw_bytes_per_s + overhead_s
    tok_per_s         = 1 / seconds_per_token

Read in reverse, a measured tok/s and an assumed BW give the *effective* bytes a token moved
(``inferred_bytes_per_token``), which can be set beside the bytes counted in the MIL graph. That
is the write-up's cross-check (section 4): 55,900 MB/s ÷ 54.30 tok/s = 1,030 MB/token (Q-fold),
÷ 20.39 tok/s = 2,742 MB/token (repeat_kv); the 1,712 MB difference is ≈ 15% below the graph's
2,013 MB of tile writes + reads. It establishes scale and direction, not a DRAM measurement.

With several builds on one device the BW (and optionally the overhead) can be fitted instead of
assumed; when one bandwidth cannot explain the builds the fit says so rather than averaging the
disagreement away.

Units: bytes and bytes/s inside. MB = 10^6 bytes and MiB = 2^20 bytes; every label names which.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from types import MappingProxyType
from typing import Literal

import numpy as np

from analyzer.device.logs import TOK_PER_S_RANGE, BuildDeviceSummary
from analyzer.fmt import MB

FitModel = Literal["single-point", "bandwidth", "bandwidth+overhead"]
Weighting = Literal["build", "runs"]
AssumptionKind = Literal["fixed", "fit", "preset"]

BW_RANGE_BYTES_PER_S: tuple[float, float] = (1e3, 1e16)
"""Accepted bandwidths, inclusive. Judgement: 1 kB/s is below any memory system; 10^16 B/s (10 PB/s) is
~1,000x the fastest HBM3e package (~8 TB/s). Inside it, and with tok/s inside ``TOK_PER_S_RANGE`` and bytes
below 2^63, every product and quotient of the model stays a finite float64 (issue #11: 1e-300 tok/s or a
1e308 B/s bandwidth overflowed the inferred bytes)."""

MAX_BYTES_PER_TOKEN = 2**63 - 1
"""Bytes per token are int64 wherever they are stored (frames, JSON consumers)."""

DEFAULT_MAX_RESIDUAL_PCT = 10.0
"""Above this |measured − fitted| / measured, one bandwidth is said not to explain the builds.

10% is a judgement, not a standard: run-to-run spread on a phone is a few percent, and the
write-up's own cross-check lands 15% from the graph, so a 10% miss is already a finding.
"""


@dataclass(frozen=True, slots=True)
class BandwidthPreset:
    """A named bandwidth with the source it was taken from and what it is (and is not)."""

    key: str
    label: str
    bytes_per_s: int
    source: str
    caveat: str


WRITEUP_AB_IPHONE = BandwidthPreset(
    key="writeup-ab-iphone",
    label="Write-up A/B iPhone, 55,900 MB/s (1 MB = 10^6 bytes), assumed",
    bytes_per_s=55_900_000_000,
    source=(
        'Seongjae Park, OptAI, "Core ML Decode Optimization: Removing the 1.9 GiB Per-Token Copy '
        'Caused by GQA repeat_kv", section 4 "Graph Estimates and Throughput Consistency" '
        "(tok/s ≈ 55,900 MB/s ÷ effective reads per token). Undated; read from the project's copy "
        "reference/gqa-repeat-kv-writeup.txt on 2026-11-30. MB = 10^6 bytes, as the write-up's "
        '"1,920 MiB, approximately 2,013 MB" shows.'
    ),
    caveat=(
        "The write-up's assumed model constant for the device of its A/B (which it does not name), "
        "not a datasheet or measured DRAM figure."
    ),
)

BANDWIDTH_PRESETS: Mapping[str, BandwidthPreset] = MappingProxyType(
    {preset.key: preset for preset in (WRITEUP_AB_IPHONE,)}
)
"""Named bandwidths with sources. Add one only with a citable figure (datasheet or measurement)."""

DEFAULT_BANDWIDTH_PRESET = WRITEUP_AB_IPHONE


@dataclass(frozen=True, slots=True)
class BandwidthAssumption:
    """The bandwidth and per-token overhead used for one device's predictions, and why."""

    bytes_per_s: float
    overhead_s: float
    kind: AssumptionKind
    source: str


def preset_assumption(preset: BandwidthPreset = DEFAULT_BANDWIDTH_PRESET) -> BandwidthAssumption:
    return BandwidthAssumption(float(preset.bytes_per_s), 0.0, "preset",
                               f"preset {preset.key}: {preset.label}")


def fixed_assumption(bw_bytes_per_s: float) -> BandwidthAssumption:
    _check_bw(bw_bytes_per_s)
    return BandwidthAssumption(float(bw_bytes_per_s), 0.0, "fixed",
                               f"fixed by the user: {bw_bytes_per_s / MB:,.0f} MB/s (10^6 bytes/s)")


# ---------------------------------------------------------------------------------------------
# The model


def _check_bw(bw_bytes_per_s: float) -> None:
    if isinstance(bw_bytes_per_s, bool) or not math.isfinite(bw_bytes_per_s) or bw_bytes_per_s <= 0:
        raise ValueError(f"bw_bytes_per_s must be a finite number > 0, got {bw_bytes_per_s!r}")
    lo, hi = BW_RANGE_BYTES_PER_S
    if not lo <= bw_bytes_per_s <= hi:
        raise ValueError(f"bw_bytes_per_s {bw_bytes_per_s:g} is outside the accepted range {lo:g} to {hi:g} bytes/s")


def _check_overhead(overhead_s: float) -> None:
    if isinstance(overhead_s, bool) or not math.isfinite(overhead_s) or overhead_s < 0:
        raise ValueError(f"overhead_s must be a finite number >= 0, got {overhead_s!r}")
    if overhead_s > 1.0 / TOK_PER_S_RANGE[0]:
        raise ValueError(f"overhead_s {overhead_s:g} s is longer than the slowest accepted token "
                         f"({1.0 / TOK_PER_S_RANGE[0]:g} s)")


def _check_bytes(bytes_per_token: int) -> None:
    if isinstance(bytes_per_token, bool) or not isinstance(bytes_per_token, numbers.Integral):
        raise TypeError(f"bytes_per_token must be an int (bytes are counted, not measured), "
                         f"got {bytes_per_token!r}")
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token}")
    if bytes_per_token > MAX_BYTES_PER_TOKEN:
        raise ValueError(f"bytes_per_token {bytes_per_token} is over 2^63 - 1")


def _check_tok(tok_per_s: float) -> None:
    if isinstance(tok_per_s, bool) or not math.isfinite(tok_per_s) or tok_per_s <= 0:
        raise ValueError(f"tok_per_s must be a finite number > 0, got {tok_per_s!r}")
    lo, hi = TOK_PER_S_RANGE
    if not lo <= tok_per_s <= hi:
        raise ValueError(f"tok_per_s {tok_per_s:g} is outside the accepted range {lo:g} to {hi:g} tok/s")


def predicted_tok_per_s(bw_bytes_per_s: float, bytes_per_token: int, overhead_s: float = 0.0) -> float:
    """tok/s the model predicts: 1 / (bytes_per_token / BW + overhead_s)."""
    _check_bw(bw_bytes_per_s)
    _check_bytes(bytes_per_token)
    _check_overhead(overhead_s)
    return 1.0 / (bytes_per_token / bw_bytes_per_s + overhead_s)


def inferred_bytes_per_token(bw_bytes_per_s: float, tok_per_s: float, overhead_s: float = 0.0) -> int:
    """Effective bytes a token moved, read back from a measured tok/s: BW × (1/tok_per_s − overhead_s).

    Rounded to whole bytes (bytes are ints here); the rounding is 1 byte in ~10^9, far below
    the model's own uncertainty.
    """
    _check_bw(bw_bytes_per_s)
    _check_tok(tok_per_s)
    _check_overhead(overhead_s)
    seconds = 1.0 / tok_per_s - overhead_s
    if seconds <= 0:
        raise ValueError(f"overhead_s {overhead_s} s is not below the measured time per token "
                         f"{1.0 / tok_per_s} s ({tok_per_s} tok/s): no time is left for moving bytes")
    return round(bw_bytes_per_s * seconds)


# ---------------------------------------------------------------------------------------------
# Cross-checks: measured vs graph


@dataclass(frozen=True, slots=True)
class BuildCrossCheck:
    """One build on one device: what was measured, what the model predicts, and the byte gap.

    ``gap_bytes`` = inferred − graph (negative: the device moved fewer effective bytes than the
    graph counts, e.g. caching absorbed re-reads); ``gap_pct`` is relative to the graph.
    ``residual_pct`` = (measured − predicted) / measured × 100. Graph fields are None for a build
    with no graph bytes (an unmapped build); ``inferred_bytes_per_token`` is None when the assumed
    overhead is not below the measured time per token (no time left for moving bytes).
    """

    build: str
    device: str
    n: int
    measured_tok_per_s: float
    bw_bytes_per_s: float
    overhead_s: float
    bw_source: str
    inferred_bytes_per_token: int | None
    graph_bytes_per_token: int | None
    predicted_tok_per_s: float | None
    residual_pct: float | None
    gap_bytes: int | None
    gap_pct: float | None


@dataclass(frozen=True, slots=True)
class PairCrossCheck:
    """Two builds on one device, the write-up's A/B form: inferred byte difference vs the graph's.

    ``build_a`` is the heavier build (more graph bytes), so differences are a − b and positive in
    the expected direction. The overhead cancels out of the inferred
    difference: BW·(1/ta − t0) − BW·(1/tb − t0) = BW·(1/ta − 1/tb).
    """

    device: str
    build_a: str
    build_b: str
    tok_per_s_a: float
    tok_per_s_b: float
    speedup: float
    bw_bytes_per_s: float
    bw_source: str
    inferred_bytes_per_token_a: int | None
    inferred_bytes_per_token_b: int | None
    inferred_diff_bytes: int
    graph_diff_bytes: int | None
    gap_bytes: int | None
    gap_pct: float | None


@dataclass(frozen=True, slots=True)
class CrossCheckReport:
    """Per-build and pairwise cross-checks; builds without graph bytes are listed, not dropped
    (they keep their row in ``builds`` with graph fields None, and are named in ``unmapped_builds``)."""

    builds: tuple[BuildCrossCheck, ...]
    pairs: tuple[PairCrossCheck, ...]
    unmapped_builds: tuple[str, ...]
    unused_graph_labels: tuple[str, ...]


def ab_crosscheck(
    *,
    device: str,
    build_a: str,
    tok_per_s_a: float,
    build_b: str,
    tok_per_s_b: float,
    bandwidth: BandwidthAssumption,
    graph_diff_bytes: int | None,
) -> PairCrossCheck:
    """The write-up's A/B: inferred bytes of a and b, their difference, and its gap to the graph's.

    ``graph_diff_bytes`` is what the graphs say a moves beyond b per token (for repeat_kv vs Q-fold:
    the tile writes + reads, 1,920 MiB = 2,013,265,920 bytes for EXAONE 4.0 1.2B at ctx 4096).
    """
    _check_tok(tok_per_s_a)
    _check_tok(tok_per_s_b)
    inferred_a = _inferred_or_none(bandwidth, tok_per_s_a)
    inferred_b = _inferred_or_none(bandwidth, tok_per_s_b)
    diff = round(bandwidth.bytes_per_s * (1.0 / tok_per_s_a - 1.0 / tok_per_s_b))  # t0 cancels
    gap = None if graph_diff_bytes is None else diff - graph_diff_bytes
    gap_pct = None if gap is None or graph_diff_bytes == 0 else 100.0 * gap / graph_diff_bytes
    return PairCrossCheck(
        device=device,
        build_a=build_a,
        build_b=build_b,
        tok_per_s_a=tok_per_s_a,
        tok_per_s_b=tok_per_s_b,
        speedup=tok_per_s_b / tok_per_s_a,
        bw_bytes_per_s=bandwidth.bytes_per_s,
        bw_source=bandwidth.source,
        inferred_bytes_per_token_a=inferred_a,
        inferred_bytes_per_token_b=inferred_b,
        inferred_diff_bytes=diff,
        graph_diff_bytes=graph_diff_bytes,
        gap_bytes=gap,
        gap_pct=gap_pct,
    )


def _inferred_or_none(bandwidth: BandwidthAssumption, tok_per_s: float) -> int | None:
    if 1.0 / tok_per_s <= bandwidth.overhead_s:
        return None
    return inferred_bytes_per_token(bandwidth.bytes_per_s, tok_per_s, bandwidth.overhead_s)


def _assumption_for(bandwidth: BandwidthAssumption | Mapping[str, BandwidthAssumption],
                    device: str) -> BandwidthAssumption:
    if isinstance(bandwidth, BandwidthAssumption):
        return bandwidth
    try:
        return bandwidth[device]
    except KeyError:
        raise ValueError(f"no bandwidth given for device {device!r}") from None


def crosscheck(
    summaries: Sequence[BuildDeviceSummary],
    graph_bytes_per_token: Mapping[str, int],
    bandwidth: BandwidthAssumption | Mapping[str, BandwidthAssumption],
) -> CrossCheckReport:
    """Every (build, device) against its graph bytes, and every pair of mapped builds on each device.

    Pairs need graph bytes on both sides (the check is inferred vs graph difference); a pair of
    unmapped builds — e.g. the write-up's device table, whose builds differ in quantization and
    chunking — would invite exactly the attribution the write-up warns against.

    ``graph_bytes_per_token`` maps a build label (as in the logs) to the graph's total bytes/token;
    ``bandwidth`` is one assumption for all devices or one per device.
    """
    for label, value in graph_bytes_per_token.items():
        try:
            _check_bytes(value)
        except (TypeError, ValueError) as e:
            raise ValueError(f"graph bytes for build {label!r}: {e}") from e
    rows: list[BuildCrossCheck] = []
    for s in summaries:
        bw = _assumption_for(bandwidth, s.device)
        graph = graph_bytes_per_token.get(s.build)
        inferred = _inferred_or_none(bw, s.mean_tok_per_s)
        predicted = None if graph is None else predicted_tok_per_s(bw.bytes_per_s, graph, bw.overhead_s)
        rows.append(BuildCrossCheck(
            build=s.build,
            device=s.device,
            n=s.n,
            measured_tok_per_s=s.mean_tok_per_s,
            bw_bytes_per_s=bw.bytes_per_s,
            overhead_s=bw.overhead_s,
            bw_source=bw.source,
            inferred_bytes_per_token=inferred,
            graph_bytes_per_token=graph,
            predicted_tok_per_s=predicted,
            residual_pct=(None if predicted is None
                          else 100.0 * (s.mean_tok_per_s - predicted) / s.mean_tok_per_s),
            gap_bytes=None if graph is None or inferred is None else inferred - graph,
            gap_pct=None if graph is None or inferred is None else 100.0 * (inferred - graph) / graph,
        ))
    pairs: list[PairCrossCheck] = []
    by_device: dict[str, list[BuildCrossCheck]] = {}
    for row in rows:
        by_device.setdefault(row.device, []).append(row)
    for device, device_rows in by_device.items():
        for x, y in combinations(device_rows, 2):
            gx, gy = x.graph_bytes_per_token, y.graph_bytes_per_token
            if gx is None or gy is None:
                continue  # no graph difference to check against; ab_crosscheck serves ad-hoc pairs
            a, b = (x, y) if gx >= gy else (y, x)
            pairs.append(ab_crosscheck(
                device=device,
                build_a=a.build,
                tok_per_s_a=a.measured_tok_per_s,
                build_b=b.build,
                tok_per_s_b=b.measured_tok_per_s,
                bandwidth=_assumption_for(bandwidth, device),
                graph_diff_bytes=abs(gx - gy),
            ))
    measured_builds = {s.build for s in summaries}
    return CrossCheckReport(
        builds=tuple(rows),
        pairs=tuple(pairs),
        unmapped_builds=tuple(sorted({r.build for r in rows if r.graph_bytes_per_token is None})),
        unused_graph_labels=tuple(sorted(set(graph_bytes_per_token) - measured_builds)),
    )


# ---------------------------------------------------------------------------------------------
# Fits per device


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
    return f"{bw_bytes_per_s / MB:,.0f} MB/s (10^6 bytes/s)"


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
        _check_bytes(p.bytes_per_token)
        _check_tok(p.tok_per_s)
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
