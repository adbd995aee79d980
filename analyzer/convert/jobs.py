"""Conversions started from the dashboard, run in a background thread so no page waits for them.

The conversion itself is a child process (``analyzer.convert.launch.run_build``); this thread only reads its
progress lines. A job belongs to the browser session that started it (kept in its session state); what
every session can see — the machine-wide queue and the finished builds — lives on disk. No streamlit here.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from analyzer.convert.builds_folder import machine_queue
from analyzer.convert.launch import BuildResult, Progress, run_builds
from analyzer.errors import QfoldError
from analyzer.model.cost import BuildCost
from analyzer.model.spec import BuildSpec


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """A consistent view of a job for one page render."""

    id: str
    keys: tuple[str, ...]
    state: str  # "starting" | "running" | "done" | "failed"
    fraction: float  # over all the job's builds
    stage: str
    message: str
    current_key: str | None  # the build being converted, or the one that failed
    results: tuple[BuildResult, ...]
    error: str | None
    started_s: float
    elapsed_s: float
    estimate: BuildCost | None = None  # what the page said before it started (analyzer.model.cost)
    peak_rss_tree_bytes: int = 0  # measured: the conversion's process tree (TreeWatch); 0 before it starts
    cpu_s: float = 0.0  # measured: the CPU seconds of the conversion's processes (TreeWatch)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


class TreeWatch:
    """The peak resident memory of the conversion of ``keys`` in ``root``: its child process (found by its entry in
    the machine's queue, ``analyzer.convert.builds_folder.machine_queue``) and every process the child started (the
    variant and equivalence workers), RSS summed, sampled every ``interval_s`` by a daemon thread until ``stop``.
    The fork server the child was forked from is not counted: it was there before the conversion."""

    def __init__(self, keys: tuple[str, ...], root: Path, interval_s: float = 0.2) -> None:
        self.keys, self.root, self.interval_s = set(keys), str(Path(root).resolve()), interval_s
        self.peak_bytes = 0
        self._cpu: dict[tuple[int, float], float] = {}  # (pid, start time) → its CPU seconds when last seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="qfold-tree-watch")

    def start(self) -> TreeWatch:
        self._thread.start()
        return self

    def stop(self) -> int:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.peak_bytes

    def __enter__(self) -> TreeWatch:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def cpu_s(self) -> float:
        """CPU seconds (user + system) of the conversion's processes, as last seen (a worker's last fraction of a
        second before it exits is not seen): on an idle machine, about its wall time times the cores it kept busy."""
        return sum(self._cpu.values())

    def sample(self) -> int:
        """The conversion's summed RSS now (0 when it is not running); notes each process's CPU time."""
        pids = {e.pid for e in machine_queue() if e.key in self.keys and e.root == self.root}
        total = 0
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                for p in (proc, *proc.children(recursive=True)):
                    with contextlib.suppress(psutil.Error):
                        with p.oneshot():
                            total += p.memory_info().rss
                            t = p.cpu_times()
                            self._cpu[(p.pid, p.create_time())] = t.user + t.system
            except psutil.Error:
                continue
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_bytes = max(self.peak_bytes, self.sample())


class BuildJob:
    """One or more builds in a daemon thread, converted by ONE child process (``run_builds``): the variants of
    an A/B share its model and traces."""

    def __init__(self, specs: tuple[BuildSpec, ...], root: Path, estimate: BuildCost | None = None) -> None:
        if not specs:
            raise ValueError("a build job needs at least one BuildSpec")
        self.id = uuid.uuid4().hex[:8]
        self.specs = specs
        self.keys = tuple(s.key for s in specs)
        self.root = root
        self.estimate = estimate  # shown again beside what the build measures
        self._watch = TreeWatch(self.keys, root)
        self._lock = threading.Lock()
        self._state = "starting"
        self._index = 0
        self._progress = Progress(0.0, "starting", "starting the conversion process")
        self._results: list[BuildResult] = []
        self._error: str | None = None
        self._started = time.time()
        self._finished: float | None = None
        self._thread = threading.Thread(target=self._run, name=f"qfold-build-{self.id}", daemon=True)

    def start(self) -> BuildJob:
        self._thread.start()
        return self

    def _on_build_progress(self, p: Progress) -> None:
        with self._lock:
            if p.stage == "done" and p.message.startswith(str(self.root)):  # one build of the batch is finished
                self._index = min(self._index + 1, len(self.specs) - 1)
            self._state = "running"
            self._progress = p

    def _run(self) -> None:
        try:
            with self._lock:
                self._state = "running"
                self._progress = Progress(0.0, "starting", f"{len(self.specs)} build(s) in one conversion process")
            with self._watch:
                results = run_builds(self.specs, self.root, on_progress=self._on_build_progress)
            with self._lock:
                self._results.extend(results)
                self._state = "done"
        except QfoldError as e:  # BuildError / SourceError: a message written for the user
            with self._lock:
                self._state, self._error = "failed", str(e)
        except Exception as e:  # anything else still ends the job visibly, never silently
            with self._lock:
                self._state, self._error = "failed", f"{type(e).__name__}: {e}"
        finally:
            with self._lock:
                self._finished = time.time()

    def snapshot(self) -> JobSnapshot:
        with self._lock:
            n = len(self.specs)
            done = len(self._results)
            frac = 1.0 if self._state == "done" else min(1.0, max(done / n, self._progress.fraction))
            end = self._finished or time.time()
            return JobSnapshot(
                id=self.id,
                keys=self.keys,
                state=self._state,
                fraction=frac,
                stage=self._progress.stage,
                message=self._progress.message,
                current_key=None if self._state == "done" else self.keys[self._index],
                results=tuple(self._results),
                error=self._error,
                started_s=self._started,
                elapsed_s=end - self._started,
                estimate=self.estimate,
                peak_rss_tree_bytes=self._watch.peak_bytes,
                cpu_s=self._watch.cpu_s,
            )
