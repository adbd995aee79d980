"""The conversion child process: ``python -m analyzer.convert.child REQUEST.json BUILDS_DIR``.

Runs one or more builds end to end in its own process, because a conversion needs minutes and gigabytes
(docs/measurements.md) and must neither block nor bloat the dashboard. The request holds one build spec, or
``{"specs": [...]}``: the builds of an A/B pair share one process, one torch model and one equivalence check,
so the pair costs less than two. Per build mode (``analyzer.model.spec.BUILD_MODES``):

* ``analysis``: value-free model → traces (every variant and phase while the weights are zero pages) →
  ``milinternal`` programs → optional value-free compression → skeleton walk → ``analysis.json`` (no package;
  ``analyzer.convert.header_blobs``);
* ``materialised``: fp16 model with real or seeded random weights → ``ct.convert`` per phase → optional
  ``coremltools.optimize`` compression → ``model.mlpackage`` (one function per phase, merged) → walk →
  the decode function in the MIL interpreter against torch → ``analysis.json``.

The numerical equivalence of the variants is checked on a reduced model of the same attention geometry
(``model.valuefree.reduced_source``: 2 layers, random weights) in a worker process beside the conversions, cached under
``builds/.equivalence/``; every build's ``torch_variants`` check says which model it ran on. The child reports
progress as ``@@qfold {json}`` lines on stdout, holds the per-key and machine-wide locks itself (so they are
released only when the work really stops), writes each build into ``.tmp-<key>-<pid>/`` and renames it into
place as that build's very last step.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil
from filelock import FileLock, Timeout

from analyzer import quiet_coremltools
from analyzer.analysis.record import ANALYSIS_FILE, Analysis, function_analysis_file, write_analysis
from analyzer.convert.builds_folder import (
    QueueEntry,
    clean_stale_tmp,
    key_lock,
    queue_entry_path,
    remove_machine_entry,
    tmp_folder,
    write_machine_entry,
    write_queue_entry,
)
from analyzer.convert.checks import ReducedEquivalences, is_reduced_size
from analyzer.convert.coreai_build import coreai_group
from analyzer.convert.launch import LOG_FILE, is_complete
from analyzer.convert.modes import analysis_group, analysis_workers, materialised_group
from analyzer.convert.progress import (  # noqa: F401  (peak_rss_bytes: re-exported)
    LOG,
    T0,
    SharedWorkers,
    emit,
    peak_rss_bytes,
    report_errors,
    result,
)
from analyzer.convert.step import convert_step, ct_io  # noqa: F401  (re-exported: tests and tools import them here)
from analyzer.errors import BuildError
from analyzer.fsio import read_json
from analyzer.model.backends import COREAI
from analyzer.model.spec import ANALYSIS_MODE, MATERIALISED_MODE, BuildSpec

THREADS_ENV = "OMP_NUM_THREADS"  # torch's own default thread count reads it


def check_numpy() -> None:
    """coremltools 9.0's ``aten::Int``/``aten::Bool`` cast of size-1 constants fails under NumPy ≥ 2.4
    ("only 0-dimensional arrays can be converted to Python scalars", docs/measurements.md). qfold pins numpy<2.4
    in requirements.txt rather than patching coremltools at run time; fail early and say so."""

    major, minor = (int(x) for x in np.__version__.split(".")[:2])
    if (major, minor) >= (2, 4):
        raise BuildError(
            f"numpy {np.__version__} breaks coremltools 9.0's torch frontend (aten::Int on size-1 arrays); "
            "install the pinned numpy<2.4 from requirements.txt"
        )


def _group_key(spec: BuildSpec) -> str:
    """Builds that can share one torch model: same source, mode, compression (so the same untie), backend and
    weight dtype."""
    return json.dumps([spec.source.fingerprint(), spec.build_mode, spec.compression, spec.backend, spec.weights],
                      sort_keys=True)


def build_all(specs: list[BuildSpec], out_dirs: dict[str, Path],
              equivalence_cache: Path | None = None) -> Iterator[tuple[BuildSpec, tuple[Analysis, ...]]]:
    """Do the work of ``specs`` (each into ``out_dirs[key]``), grouped so builds that can share a model do;
    yields each build's analyses (one per function of its package, the default function first) as soon as they
    are made."""
    import torch

    check_numpy()
    if THREADS_ENV not in os.environ:  # an explicit OpenMP thread count (a shared machine, a test worker) is kept
        torch.set_num_threads(max(1, os.cpu_count() or 1))
    groups: dict[str, list[BuildSpec]] = {}
    for s in specs:
        groups.setdefault(_group_key(s), []).append(s)
    # an analysis A/B keeps the other cores busy with its variant workers: its equivalence check runs here; so
    # does the check of builds no larger than the reduced model (a worker would take longer to start than they)
    side_by_side = (os.cpu_count() or 1) > 1 and any(len(g) > 1 for g in groups.values()) and all(
        g[0].build_mode == ANALYSIS_MODE for g in groups.values())
    small = all(is_reduced_size(s) for s in specs)
    in_process = ("(a model of the reduced model's size: quicker than starting a worker)" if small else
                  "after its own conversion" if side_by_side else "")
    # every worker process of this child in one pool, forked at once before any thread runs (progress.SharedWorkers)
    workers = SharedWorkers(max((analysis_workers(g) for g in groups.values()
                                 if g[0].build_mode == ANALYSIS_MODE), default=0))  # Core AI's too (coreai_build)
    equivalences = ReducedEquivalences(specs, equivalence_cache, in_process, workers)  # plans its own worker
    try:
        done = 0
        for group in groups.values():
            run_group = (coreai_group if group[0].backend == COREAI else
                         materialised_group if group[0].build_mode == MATERIALISED_MODE else analysis_group)
            for spec, analyses in run_group(group, out_dirs, equivalences, done, len(specs)):
                done += 1
                yield spec, analyses
    finally:
        equivalences.close()
        workers.close()


def build(spec: BuildSpec, out_dir: Path, equivalence_cache: Path | None = None) -> tuple[Analysis, ...]:
    """One build into ``out_dir`` (``build_all`` of one spec)."""
    return next(build_all([spec], {spec.key: out_dir}, equivalence_cache))[1]


class _QueueEntry:
    """A file in ``builds/.queue`` and one in the machine's queue folder, so every session can show what is queued or
    converting (on the machine, whatever its builds folder)."""

    def __init__(self, root: Path, key: str):
        self.path = queue_entry_path(root, key)
        self.key = key
        self.root = str(root.resolve())
        self.since = time.time()

    def set(self, state: str) -> None:
        entry = QueueEntry(self.key, os.getpid(), state, self.since, self.root, psutil.Process().create_time())
        write_queue_entry(self.path, entry)
        write_machine_entry(entry)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
        remove_machine_entry(self.key)


def read_request(request: Path) -> list[BuildSpec]:
    """A request file: one spec (``BuildSpec.to_json``) or ``{"specs": [spec, ...]}``."""
    data = read_json(request)
    if isinstance(data, dict) and "specs" in data:
        return [BuildSpec.from_json(d, f"{request}: specs[{i}]") for i, d in enumerate(data["specs"])]
    return [BuildSpec.from_json(data, str(request))]


def _waited_for(lock: FileLock, why: str) -> FileLock:
    """``lock``, acquired; while another process holds it, a ``queued`` line every 5 s (the parent does not count
    time queued against the child's time limit: ``analyzer.convert.launch.run_child``)."""
    while True:
        try:
            lock.acquire(timeout=5)
            return lock
        except Timeout:
            emit(0.0, "queued", f"waiting: {why}")


def run(request: Path, root: Path) -> int:
    specs = list({s.key: s for s in read_request(request)}.values())
    entries = {s.key: _QueueEntry(root, s.key) for s in specs}
    try:
        with ExitStack() as stack:
            for key in sorted(entries):  # one order for every process: no lock cycles
                lock = _waited_for(key_lock(root, key), f"build {key} is being made by another request; this "
                                   "one reuses it when it is done")
                stack.callback(lock.release)
            todo = [s for s in specs if not is_complete(root / s.key)]
            for s in specs:
                if s not in todo:
                    emit(1.0, "done", f"reusing {root / s.key}")
                    result(s.key, "reused")
            if not todo:
                return 0
            clean_stale_tmp(root, holding=set(entries))
            for s in todo:
                entries[s.key].set("queued")
            slot = _waited_for(FileLock(str(root / ".locks" / "convert.lock")),
                               "another conversion is running on this machine")
            tmps = {s.key: tmp_folder(root, s.key) for s in todo}
            try:
                for s in todo:
                    entries[s.key].set("running")
                    tmps[s.key].mkdir()
                for spec, analyses in build_all(todo, tmps, root / ".equivalence"):
                    tmp = tmps.pop(spec.key)
                    timings = {**analyses[0].build.timings_s, "total_s": round(time.monotonic() - T0, 3)}
                    for a in analyses:  # analysis.json for the default function, one file for each other one
                        name = ANALYSIS_FILE if a is analyses[0] else function_analysis_file(a.function)
                        write_analysis(tmp / name, replace(a, build=replace(a.build, timings_s=timings)))
                    (tmp / LOG_FILE).write_text("\n".join(LOG) + "\n")
                    os.rename(tmp, root / spec.key)  # the one step that makes the build look finished
                    entries[spec.key].remove()
                    emit((len(todo) - len(tmps)) / len(todo), "done", str(root / spec.key))
                    result(spec.key, "built")
            finally:
                for tmp in tmps.values():
                    shutil.rmtree(tmp, ignore_errors=True)
                slot.release()
    finally:
        for entry in entries.values():
            entry.remove()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m analyzer.convert.child REQUEST.json BUILDS_DIR", file=sys.stderr)
        return 2

    quiet_coremltools()
    gc.freeze()  # the imports live as long as the process: collections scan what the conversion makes (fork_server)
    return report_errors(lambda: run(Path(argv[0]), Path(argv[1])))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
