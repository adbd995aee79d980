"""Sweeps: models × compression × variant × ctx × phase, built on Ray, one row per point.

A sweep is the grid of ``SweepPoint`` s spanned by its dimensions (``DIMENSIONS``, one entry per axis: adding
``phase`` is one ``Dimension`` here plus its field on ``SweepPoint``). Each point is an ordinary build
(``BuildSpec``, same content-hashed key as ``qfold build``), so a sweep and single builds share
``builds/``:

    driver                                  Ray worker (local in-process cluster, or --address)
    ──────                                  ──────────
    spec → points → BuildSpec (key)
    key already in builds/?  → "reused"
    one graph at ≥ 4 ctx?    → 3 converted, the rest "derived" (below)
    else submit, memory = estimate    ──►   run_build(spec, <worker scratch>/<task>)   (child process)
                                      ◄──   analysis.json + build.log as text (no weights)
    write builds/<key>/ atomically          scratch folder (with the .mlpackage) removed
    derived points: the affine law in ctx, proven on the third conversion → builds/.derived/<key>/
    row: tiles, bytes_<category>, predicted tok/s (a derived row names the ctx it was derived from)

Op structure does not change with ctx and every tensor size is affine in it, so a context sweep costs three
conversions per graph and config regime, not one per point (``analyzer.sweep.derive``).

Why the analysis travels back instead of the worker writing into the driver's ``builds/``: on a cluster the
worker has no access to the driver's disk, and one code path for laptop and cluster is the point (the same sweep
with no change but ``--address``). A sweep is about analyses: its points build in analysis mode by default
(``--mode``; value-free weights, no package, ≈ 1-2 GB whatever the model size), and a materialised point's
package (≈ 2.5 GB at full size) stays behind.
A build folder made by a sweep therefore holds ``analysis.json`` and ``build.log`` but no ``model.mlpackage``,
like the shipped analyses; every view works from the analysis alone. Each task converts in its own scratch
folder, so ``run_build``'s machine-wide conversion lock (which is per builds folder) does not serialise the
sweep: Ray's ``memory`` resource does the admission instead (``build_memory_bytes``, from
``analyzer.model.cost``), so a 16 GB worker never
takes two full-size builds. The torch equivalence check, which depends on the source, KV mode and ctx but not on
the variant or compression, is cached in one folder per host (the driver's ``builds/.equivalence`` when the
worker runs on the driver's host), as ``run_build`` caches it for single builds.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analyzer.convert.compress import canonical_spec
from analyzer.convert.launch import builds_dir, is_complete
from analyzer.errors import QfoldError
from analyzer.model.cost import estimate
from analyzer.model.sources import STRUCTURE_OVERRIDES, geometry_of, load_config, resolve_source
from analyzer.model.spec import BuildSpec
from analyzer.predict.profiles import DEFAULT_PROFILE, get_profile
from analyzer.sweep.derive import CtxSegment, derive_segment, plan_segments
from analyzer.sweep.grid import NO_COMPRESSION, SweepPoint, SweepSpec
from analyzer.sweep.ray_workers import RayBuilds, RayOptions, check_address
from analyzer.sweep.table import STATUSES, SweepRow, finished_row


def build_memory_bytes(spec: BuildSpec, config: Any = None) -> int:
    """Peak memory one conversion of ``spec`` is expected to take: the Ray ``memory`` it reserves. ``config``:
    its source's transformers config, when the caller has it already."""

    config = config or load_config(spec.source)
    return estimate(config, spec.ctx, spec.build_mode, spec.backend, spec.weights).peak_rss_bytes


# ------------------------------------------------------------------------------------------------- the run
@dataclass(frozen=True, slots=True)
class SweepEvent:
    """What the driver reports while it runs: a row changed (``row``), or a line of news (``message``)."""

    rows: tuple[SweepRow, ...]
    row: SweepRow | None = None
    message: str = ""

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for r in self.rows:
            out[r.status] += 1
        return out


@dataclass(frozen=True, slots=True)
class SweepResult:
    rows: tuple[SweepRow, ...]
    root: Path
    used_ray: bool
    seconds: float

    @property
    def n_built(self) -> int:
        """Conversions this run made."""
        return sum(r.status == "built" for r in self.rows)

    @property
    def n_reused(self) -> int:
        return sum(r.status == "reused" for r in self.rows)

    @property
    def n_derived(self) -> int:
        """Points derived from converted points of the same graph (no conversion of their own)."""
        return sum(r.status == "derived" for r in self.rows)

    @property
    def n_failed(self) -> int:
        return sum(r.status == "failed" for r in self.rows)

    @property
    def ok(self) -> bool:
        return self.n_failed == 0


@dataclass(slots=True)
class _Plan:
    """Driver-side resolution of a point: its BuildSpec (or why it has none) and its reserved memory."""

    row: SweepRow
    spec: BuildSpec | None = None
    memory_bytes: int = 0


def plan_points(spec: SweepSpec, points: Sequence[SweepPoint]) -> list[_Plan]:
    """Resolve every point to a BuildSpec on the driver. A point that cannot be resolved (bad model, bad
    compression spec, ctx below the equivalence steps) becomes a failed row; the others are kept."""

    overrides = (list(STRUCTURE_OVERRIDES) if spec.structure else []) + list(spec.overrides)
    sources: dict[str, Any] = {}
    configs: dict[str, Any] = {}  # one transformers config per model, not per point
    plans = []
    for point in points:
        row = SweepRow(point, "pending", structure=spec.structure, kv_mode=spec.kv_mode)
        try:
            if point.model not in sources:
                try:
                    sources[point.model] = resolve_source(point.model, overrides, seed=spec.seed)
                    configs[point.model] = load_config(sources[point.model])
                except QfoldError as e:
                    sources[point.model] = e
            source = sources[point.model]
            if isinstance(source, QfoldError):
                raise source
            config = configs[point.model]
            compression = None
            if point.compression != NO_COMPRESSION:
                compression = canonical_spec(point.compression, geometry_of(config).num_layers)
            build = BuildSpec(source, point.variant, spec.kv_mode, point.ctx, compression, spec.equivalence_steps,
                              point.phase, spec.q_len if point.phase == "prefill" else 1,
                              build_mode=spec.build_mode)
            plans.append(_Plan(replace(row, key=build.key, model_label=source.label), build,
                               build_memory_bytes(build, config)))
        except QfoldError as e:
            plans.append(_Plan(replace(row, status="failed", error=str(e), stage="spec")))
    return plans


def run_sweep(spec: SweepSpec, root: str | Path | None = None, *, points: Sequence[SweepPoint] | None = None,
              ray_options: RayOptions | None = None, profile=None,
              on_event: Callable[[SweepEvent], None] | None = None) -> SweepResult:
    """Build every point not already in ``root`` (``--builds-dir`` / ``$QFOLD_BUILDS`` / ``builds/``) and return one
    row per point. ``points`` defaults to the spec's grid (a caller may add or drop points).

    Points of one graph at four or more context lengths are not all converted (``analyzer.sweep.derive``):
    three are converted on Ray, the others derived from them on the driver once they are done; a segment whose
    law does not hold has its other points converted after all."""

    t0 = time.monotonic()
    ray_options = ray_options or RayOptions()
    root = builds_dir(root)
    profile = profile or get_profile(spec.device or DEFAULT_PROFILE)
    plans = plan_points(spec, spec.points() if points is None else points)
    rows: list[SweepRow] = [p.row for p in plans]

    def emit(row: SweepRow | None = None, message: str = "") -> None:
        if on_event is not None:
            on_event(SweepEvent(tuple(rows), row, message))

    def settle(i: int, row: SweepRow) -> None:
        rows[i] = row
        emit(row)

    todo, complete = [], set()
    for i, plan in enumerate(plans):
        if plan.spec is None:
            continue
        final = root / plan.row.key
        if is_complete(final):
            try:
                settle(i, finished_row(replace(plan.row, status="reused"), final, profile))
                complete.add(i)
            except (QfoldError, KeyError, ValueError) as e:
                settle(i, replace(plan.row, status="failed", error=f"{final}: unreadable analysis ({e})"))
        else:
            todo.append(i)
    specs = [p.spec for p in plans]
    segments = plan_segments(specs, complete)
    to_derive = {i for s in segments for i in s.derived}
    for s in segments:
        for i in s.derived:
            rows[i] = replace(rows[i], stage=f"to derive from ctx {_ctx_list(specs, s.converted)}")
    if ray_options.address and any(i not in to_derive for i in todo):
        check_address(ray_options.address)  # a cluster that cannot work is said before anything is converted
    emit(message=f"{len(rows)} points: {len(complete)} already built, {len(todo) - len(to_derive)} to convert, "
                 f"{len(to_derive)} to derive from converted points (affine in ctx), "
                 f"{sum(r.status == 'failed' for r in rows)} invalid")
    with RayBuilds(plans, rows, root, profile, ray_options, emit, settle) as ray_builds:
        ray_builds.build([i for i in todo if i not in to_derive])
        again: list[int] = []
        for segment in segments:
            again += _derive(segment, specs, rows, root, profile, emit, settle)
        ray_builds.build(again)
    return SweepResult(tuple(rows), root, ray_builds.used, time.monotonic() - t0)


def _ctx_list(specs, indices) -> str:
    return ", ".join(str(specs[i].ctx) for i in indices)


def _derive(segment: CtxSegment, specs, rows: list[SweepRow], root: Path, profile, emit, settle) -> list[int]:
    """Derive a segment's points (settling their rows); returns the points to convert instead when its converted
    points failed or the law does not hold on them."""
    label = rows[segment.converted[0]].point
    what = f"model={label.model} compression={label.compression} variant={label.variant} phase={label.phase}"
    failed = [specs[i].ctx for i in segment.converted if not rows[i].ok]
    if failed:
        emit(message=f"{what}: ctx {', '.join(map(str, failed))} failed, so nothing is derived from it; converting "
                     f"ctx {_ctx_list(specs, segment.derived)} instead")
        return list(segment.derived)
    try:
        derived = derive_segment(segment, specs, root)
    except QfoldError as e:
        emit(message=f"{what}: not derived ({e}); converting ctx {_ctx_list(specs, segment.derived)} instead")
        return list(segment.derived)
    made_from = tuple(specs[i].ctx for i in segment.converted)
    for i, (analysis, path, seconds) in derived.items():
        row = replace(rows[i], status="derived", derived_from_ctx=made_from, seconds=seconds)
        settle(i, finished_row(row, path, profile, analysis))
    return []


def describe_progress(event: SweepEvent, width: int = 24) -> str:
    """One stderr line: a bar over the finished points, the counts, and what changed."""
    c = event.counts()
    n = len(event.rows)
    done = c["built"] + c["reused"] + c["derived"] + c["failed"]
    filled = round(width * done / n) if n else width
    bar = "#" * filled + "." * (width - filled)
    head = (f"[{bar}] {done}/{n} · {c['built']} built, {c['reused']} reused, {c['derived']} derived, "
            f"{c['failed']} failed, {c['running']} running")
    if event.row is not None:
        r = event.row
        tail = r.status if r.status != "running" else r.stage
        if r.status == "failed":
            tail = f"FAILED: {r.error}"
        elif r.status == "built":
            tail = f"built in {r.seconds:.0f} s"
        elif r.status == "derived":
            a, b, check = r.derived_from_ctx
            tail = f"derived from ctx {a} and {b} (law checked at ctx {check}) in {r.seconds:.2f} s"
        return f"{head} | {r.point.describe()}: {tail}"
    return f"{head} | {event.message}"


def progress_printer(stream=None) -> Callable[[SweepEvent], None]:
    stream = sys.stderr if stream is None else stream

    def show(event: SweepEvent) -> None:
        print(describe_progress(event), file=stream, flush=True)

    return show



class SweepJob:
    """A sweep run from the dashboard in a daemon thread; ``snapshot()`` gives the live rows for a page render.
    The thread only drives Ray (the builds are Ray tasks and child processes), so no page waits for it."""

    def __init__(self, spec: SweepSpec, root: str | Path | None = None, *, ray_options: RayOptions | None = None,
                 profile=None) -> None:

        self.id = uuid.uuid4().hex[:8]
        self.spec = spec
        self._lock = threading.Lock()
        self._rows: tuple[SweepRow, ...] = tuple(SweepRow(p, "pending") for p in spec.points())
        self._messages: list[str] = []
        self._result: SweepResult | None = None
        self._error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(root, ray_options, profile),
                                        name=f"qfold-sweep-{self.id}", daemon=True)

    def start(self) -> SweepJob:
        self._thread.start()
        return self

    def _on_event(self, event: SweepEvent) -> None:
        with self._lock:
            self._rows = event.rows
            if event.message:
                self._messages.append(event.message)

    def _run(self, root, ray_options: RayOptions, profile) -> None:
        try:
            result = run_sweep(self.spec, root, ray_options=ray_options, profile=profile, on_event=self._on_event)
            with self._lock:
                self._result, self._rows = result, result.rows
        except QfoldError as e:
            with self._lock:
                self._error = str(e)
        except Exception as e:  # the job ends visibly, never silently
            with self._lock:
                self._error = f"{type(e).__name__}: {e}"

    def snapshot(self) -> tuple[tuple[SweepRow, ...], bool, str | None, tuple[str, ...]]:
        """(rows, finished, error, messages)."""
        with self._lock:
            finished = self._result is not None or self._error is not None
            return self._rows, finished, self._error, tuple(self._messages)
