"""Sweeps: models × compression × variant × ctx × phase, built on Ray, one row per point.

A sweep is the grid of ``SweepPoint`` s spanned by its dimensions (``DIMENSIONS``, one entry per axis: adding
``phase`` is one ``Dimension`` here plus its field on ``SweepPoint``). Each point is an ordinary build
(``BuildSpec``, same content-hashed key as ``python -m analyzer build``), so a sweep and single builds share
``builds/``:

    driver                                  Ray worker (local in-process cluster, or --address)
    ──────                                  ──────────
    spec → points → BuildSpec (key)
    key already in builds/?  → "reused"
    else submit, memory = estimate    ──►   run_build(spec, <worker scratch>/<task>)   (child process)
                                      ◄──   analysis.json + build.log as text (no weights)
    write builds/<key>/ atomically          scratch folder (with the .mlpackage) removed
    row: tiles, bytes_<category>, predicted tok/s

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

import json
import socket
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from analyzer.build.builds import BuildSpec, builds_dir, is_complete
from analyzer.device.sweep_ray import RayOptions, build_on_worker, largest_node_memory, ray_session, store_analysis
from analyzer.device.sweep_spec import NO_COMPRESSION, SweepPoint, SweepSpec
from analyzer.device.sweep_table import STATUSES, SweepRow, finished_row
from analyzer.errors import QfoldError


def build_memory_bytes(spec: BuildSpec) -> int:
    """Peak memory one conversion of ``spec`` is expected to take: the Ray ``memory`` it reserves."""
    from analyzer.model.cost import estimate
    from analyzer.model.sources import load_config

    return estimate(load_config(spec.source), spec.ctx, spec.build_mode).peak_rss_bytes


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
        return sum(r.status == "built" for r in self.rows)

    @property
    def n_reused(self) -> int:
        return sum(r.status == "reused" for r in self.rows)

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
    from analyzer.build.compress import canonical_spec
    from analyzer.model.sources import STRUCTURE_OVERRIDES, geometry_of, load_config, resolve_source

    overrides = (list(STRUCTURE_OVERRIDES) if spec.structure else []) + list(spec.overrides)
    sources: dict[str, Any] = {}
    plans = []
    for point in points:
        row = SweepRow(point, "pending", structure=spec.structure, kv_mode=spec.kv_mode)
        try:
            if point.model not in sources:
                try:
                    sources[point.model] = resolve_source(point.model, overrides, seed=spec.seed)
                except QfoldError as e:
                    sources[point.model] = e
            source = sources[point.model]
            if isinstance(source, QfoldError):
                raise source
            compression = None
            if point.compression != NO_COMPRESSION:
                compression = canonical_spec(point.compression, geometry_of(load_config(source)).num_layers)
            build = BuildSpec(source, point.variant, spec.kv_mode, point.ctx, compression, spec.equivalence_steps,
                              point.phase, spec.q_len if point.phase == "prefill" else 1,
                              build_mode=spec.build_mode)
            plans.append(_Plan(replace(row, key=build.key, model_label=source.label), build,
                               build_memory_bytes(build)))
        except QfoldError as e:
            plans.append(_Plan(replace(row, status="failed", error=str(e), stage="spec")))
    return plans


def equivalence_groups(specs: Sequence[BuildSpec]) -> list[list[int]]:
    """Indices of ``specs`` grouped by what the conversion's equivalence check depends on: everything in the
    build's fingerprint but the variant, the compression and the build mode (``analyzer.build.equivalence``:
    it runs on a reduced model of the same geometry)."""
    groups: dict[str, list[int]] = {}
    for i, spec in enumerate(specs):
        fingerprint = {k: v for k, v in spec.fingerprint().items()
                       if k not in ("variant", "compression", "build_mode")}
        groups.setdefault(json.dumps(fingerprint, sort_keys=True), []).append(i)
    return list(groups.values())


def run_sweep(spec: SweepSpec, root: str | Path | None = None, *, points: Sequence[SweepPoint] | None = None,
              ray_options: RayOptions | None = None, profile=None,
              on_event: Callable[[SweepEvent], None] | None = None) -> SweepResult:
    """Build every point not already in ``root`` (``--builds-dir`` / ``$QFOLD_BUILDS`` / ``builds/``) on Ray and
    return one row per point. ``points`` defaults to the spec's grid (a caller may add or drop points)."""
    from analyzer.device.profiles import DEFAULT_PROFILE, get_profile

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

    todo = []
    for i, plan in enumerate(plans):
        if plan.spec is None:
            continue
        final = root / plan.row.key
        if is_complete(final):
            try:
                settle(i, finished_row(replace(plan.row, status="reused"), final, profile))
            except (QfoldError, KeyError, ValueError) as e:
                settle(i, replace(plan.row, status="failed", error=f"{final}: unreadable analysis ({e})"))
        else:
            todo.append(i)
    reused = sum(r.status == "reused" for r in rows)
    emit(message=f"{len(rows)} points: {reused} already built, {len(todo)} to build, "
                 f"{sum(r.status == 'failed' for r in rows)} invalid")
    if not todo:
        return SweepResult(tuple(rows), root, False, time.monotonic() - t0)

    root.mkdir(parents=True, exist_ok=True)
    equivalence = root / ".equivalence"
    equivalence.mkdir(exist_ok=True)
    with ray_session(ray_options) as ray:
        from ray.util.queue import Queue

        capacity = largest_node_memory(ray)
        task = ray.remote(num_cpus=1, max_retries=0)(build_on_worker)
        queue = Queue(actor_options={"num_cpus": 0})
        where = ray_options.address or f"local Ray, {int(ray.cluster_resources().get('CPU', 0))} CPUs"
        emit(message=f"building {len(todo)} points on {where}")
        pending: dict[Any, int] = {}

        def submit(i: int) -> None:
            plan = plans[i]
            memory = plan.memory_bytes
            if capacity and memory > capacity:
                emit(message=f"{plan.row.point.describe()}: needs ~{memory / 1e9:.1f} GB, more than the largest "
                             f"node's {capacity / 1e9:.1f} GB schedulable memory; it takes a whole node")
                memory = capacity
            payload = {**plan.spec.to_json(), "_point": i}
            ref = task.options(memory=memory).remote(payload, socket.gethostname(), str(equivalence), queue)
            pending[ref] = i
            rows[i] = replace(plan.row, memory_bytes=plan.memory_bytes, stage="queued")

        # The first point of each equivalence group goes first; the rest follow when it is done, so the torch
        # equivalence check (shared by every variant and compression of a source, KV mode and ctx) runs once.
        followers: dict[int, list[int]] = {}
        for group in equivalence_groups([plans[i].spec for i in todo]):
            leader, *rest = (todo[j] for j in group)
            followers[leader] = rest
            submit(leader)
        emit(message="submitted")
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            while not queue.empty():
                try:
                    i, _fraction, stage, message = queue.get_nowait()
                except Exception:
                    break
                if rows[i].status in ("pending", "running"):
                    settle(i, replace(rows[i], status="running", stage=f"{stage}: {message}"[:200]))
            for ref in ready:
                i = pending.pop(ref)
                settle(i, _collect(ray, ref, rows[i], root, profile))
                for j in followers.pop(i, ()):
                    submit(j)
        try:
            ray.kill(queue.actor)
        except Exception:
            pass
    return SweepResult(tuple(rows), root, True, time.monotonic() - t0)


def _collect(ray, ref, row: SweepRow, root: Path, profile) -> SweepRow:
    try:
        out = ray.get(ref)
    except Exception as e:  # RayTaskError, WorkerCrashedError, OutOfMemoryError: this point only
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return replace(row, status="failed", error=f"{type(e).__name__}: {first}"[:500], stage="ray")
    row = replace(row, host=out.get("host", ""), seconds=float(out.get("seconds", 0.0)))
    if "error" in out:
        return replace(row, status="failed", error=out["error"], stage="build")
    try:
        final = store_analysis(root, row.key, out["analysis"], out["log"])
        return finished_row(replace(row, status="built"), final, profile)
    except (QfoldError, OSError, KeyError, ValueError) as e:
        return replace(row, status="failed", error=str(e), stage="store")


def describe_progress(event: SweepEvent, width: int = 24) -> str:
    """One stderr line: a bar over the finished points, the counts, and what changed."""
    c = event.counts()
    n = len(event.rows)
    done = c["built"] + c["reused"] + c["failed"]
    filled = round(width * done / n) if n else width
    bar = "#" * filled + "." * (width - filled)
    head = (f"[{bar}] {done}/{n} · {c['built']} built, {c['reused']} reused, {c['failed']} failed, "
            f"{c['running']} running")
    if event.row is not None:
        r = event.row
        tail = r.status if r.status != "running" else r.stage
        if r.status == "failed":
            tail = f"FAILED: {r.error}"
        elif r.status == "built":
            tail = f"built in {r.seconds:.0f} s"
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
        import threading
        import uuid

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
