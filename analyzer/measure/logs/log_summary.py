"""Repeated runs → one figure per condition, averaged the way the bandwidth model needs.

Why the harmonic mean: the model is linear in time per token (t = bytes / BW + t0), so runs are averaged as
seconds per token and the mean is turned back into a rate: mean_tok_per_s = 1 / mean(1 / tok_per_s_i) = the
harmonic mean of the runs' tok/s. The arithmetic mean of tok/s over-weights fast runs: 10 and 30 tok/s
average to 20 tok/s, yet the two runs took 0.1 and 0.033 s per token, 0.0667 s on average = 15 tok/s.

Why the groups: runs are averaged only within one condition (build, device, phase, context length, compute
units, quantization, OS version). A mean over two context lengths or two compute units is no run's figure,
and a fit on it would explain nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from analyzer.measure.logs.records import Measurement, Phase

GROUP_FIELDS: tuple[str, ...] = ("build", "device", "phase", "context_length", "compute_units", "quantization",
                                 "os_version")
"""What must be equal for two runs to be averaged together."""


@dataclass(frozen=True, slots=True)
class BuildDeviceSummary:
    """Throughput statistics of one build on one device in one condition, across its accepted runs.

    ``mean_tok_per_s`` is the HARMONIC mean of the runs' tok/s, 1 / (mean seconds per token); see the module
    docstring for why. ``std_tok_per_s`` is the sample standard deviation of the runs' tok/s (ddof = 1, an
    estimate of run-to-run spread); with one run there is no spread to estimate and it is reported as 0.0,
    not NaN, so tables and JSON stay numeric: read it together with ``n``. The condition fields after
    ``max_tok_per_s`` say what the runs shared (None where the logs did not say).
    """

    build: str
    device: str
    n: int
    mean_tok_per_s: float
    std_tok_per_s: float
    min_tok_per_s: float
    max_tok_per_s: float
    phase: Phase = "decode"
    context_length: int | None = None
    compute_units: str | None = None
    quantization: str | None = None
    os_version: str | None = None

    @property
    def mean_s_per_token(self) -> float:
        """The mean time per token the harmonic mean comes from."""
        return 1.0 / self.mean_tok_per_s


def _sort_key(key: tuple[object, ...]) -> tuple[tuple[bool, object], ...]:
    return tuple((value is not None, value if value is not None else "") for value in key)


def summarize(measurements: Sequence[Measurement], phase: Phase | None = "decode") -> list[BuildDeviceSummary]:
    """One summary per condition (``GROUP_FIELDS``), sorted: n, harmonic-mean tok/s, sample std (0.0 for one
    run), min and max.

    ``phase`` selects the runs: "decode" by default, because the bandwidth model (and every caller that fits
    it) is a model of decode steps; None summarizes every phase, each kept apart.
    """
    groups: dict[tuple[object, ...], list[float]] = {}
    for m in measurements:
        if phase is not None and m.phase != phase:
            continue
        groups.setdefault(tuple(getattr(m, f) for f in GROUP_FIELDS), []).append(m.tok_per_s)
    summaries = []
    for key in sorted(groups, key=_sort_key):
        values = np.asarray(groups[key], dtype=np.float64)
        # Equal runs (one run included) average to themselves exactly, not to within a rounding of 1/(1/x).
        mean = float(values[0]) if np.all(values == values[0]) else float(len(values) / np.sum(1.0 / values))
        condition = dict(zip(GROUP_FIELDS, key, strict=True))
        summaries.append(BuildDeviceSummary(
            n=len(values),
            mean_tok_per_s=mean,
            std_tok_per_s=float(values.std(ddof=1)) if len(values) > 1 else 0.0,
            min_tok_per_s=float(values.min()),
            max_tok_per_s=float(values.max()),
            **condition,  # type: ignore[arg-type]
        ))
    return summaries
