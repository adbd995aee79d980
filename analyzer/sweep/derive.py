"""Context sweeps at the price of two conversions: which points of a sweep are converted, which are derived, and
the derivation.

Points of one graph (every ``BuildSpec`` field but ctx equal) whose context lengths lie on the same side of every
config threshold (``analyzer.model.ctx_thresholds.ctx_regime``) form a *segment*. A segment of four or more points
converts three of them and derives the rest by the affine law of ``analyzer.analysis.ctx_affine``:

    ctx     512   1024   2048   4096   8192   16384   32768   65536
            basis basis  ·derived (interpolated)·······  check   derived (extrapolated one step)

* the **basis** is its two smallest ctx values (small contexts convert fastest);
* the **check** is its second-largest: the program derived there from the basis must equal its conversion op for op
  and number for number, so the law is proven over the widest span short of the largest point, which is derived
  too (the largest context is the dearest conversion);
* points already in builds/ are reused, never derived; when three or more of a segment are and the largest of them
  reaches the second-largest point, they are the basis and the check, and nothing new is converted for it.

A segment of three points or fewer converts them all, and so is every point past ``max_position_embeddings`` (the
build refuses it and the row says why). A segment whose basis failed, or whose check fails, converts
its other points instead (and the sweep says why). A derived analysis is a full analysis (op records with shapes
and sizes, so every category, layer, op count and FLOP figure), stored as ``builds/.derived/<key>/analysis.json``
with ``derived_from`` naming the conversions it came from; never as ``builds/<key>/``, where ``build`` would take
it for a conversion.
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from analyzer.analysis.buildinfo import BuildInfo
from analyzer.analysis.ctx_affine import derive_program, prove_affine
from analyzer.analysis.record import ANALYSIS_FILE, Analysis, load_analysis, write_analysis
from analyzer.errors import AnalysisFileError
from analyzer.model.ctx_thresholds import ctx_regime, past_max_positions
from analyzer.model.sources import load_config
from analyzer.model.spec import BuildSpec

DERIVED_DIR = ".derived"  # under the builds folder; a dot folder, so no build listing takes it for a build
LAW = "affine in ctx, op for op (analyzer.analysis.ctx_affine)"


@dataclass(frozen=True, slots=True)
class CtxSegment:
    """Points (indices into the sweep's specs) of one graph and ctx regime: the three converted, in ctx order (the
    basis of the law, then the check), and the ones to derive from them."""

    regime: tuple[str, ...]
    converted: tuple[int, int, int]
    derived: tuple[int, ...]


def _graph_key(spec: BuildSpec, regime: tuple[str, ...]) -> str:
    fingerprint = {k: v for k, v in spec.fingerprint().items() if k != "ctx"}
    return json.dumps([fingerprint, list(regime)], sort_keys=True)


def plan_segments(specs: Sequence[BuildSpec | None], complete: Collection[int] = ()) -> list[CtxSegment]:
    """The segments of a sweep that have points to derive. ``specs[i]`` is None for a point that failed before any
    build; ``complete`` holds the indices already in builds/ (reused, never derived)."""
    configs: dict[str, object] = {}
    groups: dict[str, list[int]] = {}
    regimes: dict[str, tuple[str, ...]] = {}
    for i, spec in enumerate(specs):
        if spec is None:
            continue
        source = json.dumps(spec.source.fingerprint(), sort_keys=True)
        if source not in configs:
            configs[source] = load_config(spec.source)
        if past_max_positions(configs[source], spec.ctx):
            continue  # refused by the build (analyzer.model.cost.check_request): converted, so it fails and says why
        regime = ctx_regime(configs[source], spec.ctx)
        key = _graph_key(spec, regime)
        groups.setdefault(key, []).append(i)
        regimes[key] = regime
    out = []
    for key, members in groups.items():
        members.sort(key=lambda i: specs[i].ctx)  # type: ignore[union-attr]
        done = [i for i in members if i in complete]
        if len(done) >= 3 and len(members) >= 4 and specs[done[-1]].ctx >= specs[members[-2]].ctx:  # type: ignore
            converted = (done[0], done[1], done[-1])  # reused conversions whose check spans as far as the default
        elif len(members) >= 4:
            converted = (members[0], members[1], members[-2])
        else:
            continue
        derived = tuple(i for i in members if i not in converted and i not in complete)
        if derived:
            out.append(CtxSegment(regimes[key], converted, derived))
    return out


def derived_folder(root: Path, key: str) -> Path:
    return Path(root) / DERIVED_DIR / key


def derive_segment(segment: CtxSegment, specs: Sequence[BuildSpec | None], root: Path
                   ) -> dict[int, tuple[Analysis, Path, float]]:
    """Prove the law on the segment's converted builds (in ``root``), then derive, store and return every other
    point: index → (analysis, its file, seconds it took). Raises ``CtxLawError`` (a QfoldError) when the check
    fails, ``AnalysisFileError`` when a converted build cannot be read."""
    (a, b, c) = (load_analysis(Path(root) / specs[i].key) for i in segment.converted)  # type: ignore[union-attr]
    for x in (a, b, c):
        if x.build is None:
            raise AnalysisFileError(f"{x.file}: no build record (not a qfold build); nothing is derived from it")
    points = tuple((x.build.spec.ctx, x.program) for x in (a, b, c))
    prove_affine(*points)
    out = {}
    for i in segment.derived:
        t0 = time.monotonic()
        spec = specs[i]
        program = derive_program(points[0], points[1], spec.ctx)  # type: ignore[union-attr]
        seconds = time.monotonic() - t0
        analysis = Analysis(program, derived_build(spec, (a, b, c), seconds))  # type: ignore[arg-type]
        folder = derived_folder(root, spec.key)  # type: ignore[union-attr]
        folder.mkdir(parents=True, exist_ok=True)
        write_analysis(folder / ANALYSIS_FILE, analysis)
        out[i] = (analysis, folder / ANALYSIS_FILE, seconds)
    return out


def derived_build(spec: BuildSpec, converted: tuple[Analysis, Analysis, Analysis], seconds: float) -> BuildInfo:
    """The build record of a derived analysis: the spec a conversion at this ctx would have (its key, so it is the
    analysis ``build --ctx N`` makes), no conversion (no timings but the derivation's, no peak memory, no package,
    no equivalence check), and ``derived_from``: the law, its two points and the point that checked it."""
    a, b, c = (x.build for x in converted)
    return BuildInfo(
        key=spec.key, created=datetime.now(UTC).isoformat(timespec="seconds"), spec=spec, geometry=a.geometry,
        versions=dict(a.versions), timings_s={"derive_s": round(seconds, 3)}, peak_rss_bytes=0, package_bytes=None,
        equivalence=None, untied_embeddings=a.untied_embeddings,
        extra={"derived_from": {"law": LAW, "basis": [{"ctx": x.spec.ctx, "key": x.key} for x in (a, b)],
                                "check": {"ctx": c.spec.ctx, "key": c.key}}})
