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
assumed (:mod:`analyzer.predict.fit`); when one bandwidth cannot explain the builds the fit says so rather
than averaging the disagreement away. The cross-check of measurements against graph bytes is
:mod:`analyzer.predict.crosscheck`.

Units: bytes and bytes/s inside. MB = 10^6 bytes and MiB = 2^20 bytes; every label names which.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from analyzer import fmt
from analyzer.measure.logs import TOK_PER_S_RANGE

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
        "(tok/s ≈ 55,900 MB/s ÷ effective reads per token). Undated; read on 2026-11-30 (its figures are "
        "quoted in examples/README.md). MB = 10^6 bytes, as the write-up's "
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
    check_bw(bw_bytes_per_s)
    return BandwidthAssumption(float(bw_bytes_per_s), 0.0, "fixed",
                               f"fixed by the user: {fmt.bandwidth(bw_bytes_per_s)} (10^6 bytes/s)")


# ---------------------------------------------------------------------------------------------
# The model


def check_bw(bw_bytes_per_s: float) -> None:
    if isinstance(bw_bytes_per_s, bool) or not math.isfinite(bw_bytes_per_s) or bw_bytes_per_s <= 0:
        raise ValueError(f"bw_bytes_per_s must be a finite number > 0, got {bw_bytes_per_s!r}")
    lo, hi = BW_RANGE_BYTES_PER_S
    if not lo <= bw_bytes_per_s <= hi:
        raise ValueError(f"bw_bytes_per_s {bw_bytes_per_s:g} is outside the accepted range {lo:g} to {hi:g} bytes/s")


def check_overhead(overhead_s: float) -> None:
    if isinstance(overhead_s, bool) or not math.isfinite(overhead_s) or overhead_s < 0:
        raise ValueError(f"overhead_s must be a finite number >= 0, got {overhead_s!r}")
    if overhead_s > 1.0 / TOK_PER_S_RANGE[0]:
        raise ValueError(f"overhead_s {overhead_s:g} s is longer than the slowest accepted token "
                         f"({1.0 / TOK_PER_S_RANGE[0]:g} s)")


def check_bytes(bytes_per_token: int) -> None:
    if isinstance(bytes_per_token, bool) or not isinstance(bytes_per_token, numbers.Integral):
        raise TypeError(f"bytes_per_token must be an int (bytes are counted, not measured), "
                         f"got {bytes_per_token!r}")
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be > 0, got {bytes_per_token}")
    if bytes_per_token > MAX_BYTES_PER_TOKEN:
        raise ValueError(f"bytes_per_token {bytes_per_token} is over 2^63 - 1")


def check_tok(tok_per_s: float) -> None:
    if isinstance(tok_per_s, bool) or not math.isfinite(tok_per_s) or tok_per_s <= 0:
        raise ValueError(f"tok_per_s must be a finite number > 0, got {tok_per_s!r}")
    lo, hi = TOK_PER_S_RANGE
    if not lo <= tok_per_s <= hi:
        raise ValueError(f"tok_per_s {tok_per_s:g} is outside the accepted range {lo:g} to {hi:g} tok/s")


def predicted_tok_per_s(bw_bytes_per_s: float, bytes_per_token: int, overhead_s: float = 0.0) -> float:
    """tok/s the model predicts: 1 / (bytes_per_token / BW + overhead_s)."""
    check_bw(bw_bytes_per_s)
    check_bytes(bytes_per_token)
    check_overhead(overhead_s)
    return 1.0 / (bytes_per_token / bw_bytes_per_s + overhead_s)


def inferred_bytes_per_token(bw_bytes_per_s: float, tok_per_s: float, overhead_s: float = 0.0) -> int:
    """Effective bytes a token moved, read back from a measured tok/s: BW × (1/tok_per_s − overhead_s).

    Rounded to whole bytes (bytes are ints here); the rounding is 1 byte in ~10^9, far below
    the model's own uncertainty.
    """
    check_bw(bw_bytes_per_s)
    check_tok(tok_per_s)
    check_overhead(overhead_s)
    seconds = 1.0 / tok_per_s - overhead_s
    if seconds <= 0:
        raise ValueError(f"overhead_s {overhead_s} s is not below the measured time per token "
                         f"{1.0 / tok_per_s} s ({tok_per_s} tok/s): no time is left for moving bytes")
    return round(bw_bytes_per_s * seconds)
