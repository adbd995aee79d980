"""Measured throughput against the graph's bytes per token: per (build, device), and the write-up's A/B form
for pairs of builds on one device (inferred byte difference vs the graph's).

Read in reverse, ``tok/s ≈ BW ÷ bytes`` turns a measured tok/s and a bandwidth into the *effective* bytes a
token moved (``inferred_bytes_per_token``), set beside the bytes the MIL graph counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from analyzer.measure.logs import BuildDeviceSummary
from analyzer.predict.bandwidth_model import (
    BandwidthAssumption,
    check_bytes,
    check_tok,
    inferred_bytes_per_token,
    predicted_tok_per_s,
)


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
    check_tok(tok_per_s_a)
    check_tok(tok_per_s_b)
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
            check_bytes(value)
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
