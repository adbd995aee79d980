"""The other phase of an analysis for the roofline and the prefill runs: the exact sibling
(:func:`analyzer.report.catalog.phase_sibling`), else the nearest one, which differs only in what a phase's FLOPs and
shapes do not depend on (its weight compression) and says so.

The default A/B of the dashboard is the pair the write-up's device log measured, top8-compressed; qfold ships the
fp16 prefill-64 analyses of both variants. Their FLOPs, tiles and KV bytes are those of the top8 model; only the
weight bytes are fp16's, and the caller shows that difference beside the figure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analyzer.report.catalog import AnalysisRef, phase_sibling

RELAXED = ("compression",)  # a sibling may differ in these fields (and names the difference)


@dataclass(frozen=True, slots=True)
class PhaseSibling:
    """``ref``: the analysis of the other phase; ``differences``: each field it differs in, worded
    (``compression fp16, not top8``), empty for an exact sibling."""

    ref: AnalysisRef
    differences: tuple[str, ...] = ()


def _value(field: str, value: object) -> str:
    return "fp16" if field == "compression" and not value else str(value)


def nearest_phase_sibling(ref: AnalysisRef, phase: str, refs: Sequence[AnalysisRef]) -> PhaseSibling | None:
    """The analysis of the same model and variant in ``phase``: the exact sibling, else one of the same kind, model,
    KV mode, ctx, backend and weights that differs only in :data:`RELAXED` fields (shipped and newest first, as
    ``refs`` lists them); None when there is neither."""
    exact = phase_sibling(ref, phase, refs)
    if exact is not None:
        return PhaseSibling(exact)
    mine = dict(ref.spec)
    keep = {k: v for k, v in mine.items() if k not in ("phase", "q_len", *RELAXED)}
    for r in refs:
        theirs = dict(r.spec)
        if r.kind == ref.kind and r.variant == ref.variant and r.phase == phase and \
                {k: v for k, v in theirs.items() if k not in ("phase", "q_len", *RELAXED)} == keep:
            return PhaseSibling(r, tuple(f"{k} {_value(k, theirs.get(k))}, not {_value(k, mine.get(k))}"
                                         for k in RELAXED if theirs.get(k) != mine.get(k)))
    return None
