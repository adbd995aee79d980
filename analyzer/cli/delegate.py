"""The dashboard's heavy work as the CLI does it, in a child process: ``qfold fold`` and ``qfold bench``.

A fold (coremltools' pass pipeline, with its process-wide patches), its proof (the MIL interpreter or the Core AI
runtime) and a bench run native code and take minutes and gigabytes. The dashboard's server is shared by every
session, so it never runs them itself: it runs the command a user would type (``python -m analyzer fold … --json``),
with the same code path, exit status and error lines, and reads its JSON. Each child has a time limit scaled to its
work (stated in the error line with how it was set); time spent waiting for the builds folder's bench lock (one
bench at a time per builds folder: ``analyzer.convert.builds_folder.bench_lock``) is not counted.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyzer.convert.builds_folder import key_lock, tmp_folder
from analyzer.convert.launch import ASSET_NAME, PACKAGE_NAME, REPO_ROOT, TIMEOUT_FACTOR, TIMEOUT_FIXED_S, child_env
from analyzer.errors import QfoldError
from analyzer.fold.cache import FOLD_FILE, FOLDS_DIR
from analyzer.fold.fold_records import fold_summary
from analyzer.fold.proof import FoldProof
from analyzer.ir.coreai.native_child import asset_bytes
from analyzer.measure.bench import BenchResult

WAITING = "waiting: "  # a child's stderr line while it waits for another process (the clock stops)
PROGRESS = "progress: "  # a child's stderr progress line: "progress: 40% round 2 of 5"
# A fold's work: the full-size 2.56 GB package folded in 26.9 s and proved over 2 steps in 10.0 s
# (bench/results/fold_full_size.json): ~15 s per GB; the proof's steps scale it.
FOLD_SECONDS_PER_GB = 15.0
# A bench's runtime calls: engines.coreai.runtime.RUNTIME_SECONDS_PER_GB of every asset per decode step.
BENCH_SECONDS_PER_GB = 5.0


@dataclass(frozen=True, slots=True)
class CliRun:
    """What one ``qfold`` command in a child did: its exit status, its ``--json`` object (None when it printed
    none) and its last error line (``error: …``, without the prefix)."""

    command: str
    exit_code: int
    doc: Any
    error: str


def run_cli(args: list[str], limit: tuple[float, str], on_line: Callable[[str], None] | None = None,
            env: dict[str, str] | None = None) -> CliRun:
    """``python -m analyzer ARGS`` in a child process of its own session, within ``limit`` (seconds of work, how
    they were set); its stderr lines reach ``on_line`` as they come. A child past its limit is stopped (its whole
    process group) and raises :class:`QfoldError` naming the limit and its last line."""
    command = "qfold " + " ".join(args)
    proc = subprocess.Popen([sys.executable, "-m", "analyzer", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO_ROOT, env=env or child_env(), start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()
    out: list[str] = []

    def pump_err() -> None:
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    def pump_out() -> None:
        out.append(proc.stdout.read())

    readers = [threading.Thread(target=f, daemon=True) for f in (pump_err, pump_out)]
    for t in readers:
        t.start()
    seconds, why = limit
    deadline, waiting_since, said = time.monotonic() + seconds, None, []
    try:
        while True:
            if waiting_since is not None:  # waiting for another process: the clock stands still
                deadline, waiting_since = deadline + time.monotonic() - waiting_since, time.monotonic()
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                last = f"; its last line: {said[-1][:200]}" if said else ""
                raise QfoldError(f"{command}: stopped after {seconds:.0f} s of work (its limit, {why}){last}") \
                    from None
            if line is None:
                break
            said.append(line)
            waiting_since = (waiting_since or time.monotonic()) if line.startswith(WAITING) else None
            if on_line is not None:
                on_line(line)
        code = proc.wait()
        for t in readers:
            t.join()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # not reaped yet: the pid is still this child's
        except ProcessLookupError:
            pass
        proc.wait()
        raise
    text = "".join(out).strip().splitlines()
    try:
        doc = json.loads(text[-1]) if text else None
    except json.JSONDecodeError:
        doc = None
    errors = [ln.removeprefix("error: ") for ln in said if ln.startswith("error: ")]
    return CliRun(command, code, doc, errors[-1] if errors else (said[-1] if said and code else ""))


def _limit(work_s: float, what: str) -> tuple[float, str]:
    return (TIMEOUT_FIXED_S + TIMEOUT_FACTOR * work_s,
            f"{TIMEOUT_FIXED_S:.0f} s + {TIMEOUT_FACTOR:.0f} x the estimated {work_s:.0f} s {what}")


# ------------------------------------------------------------------------------------------------ fold
@dataclass(frozen=True, slots=True)
class Folded:
    """A fold the CLI made: the folded package (its fold cache entry's) or asset, its report and proof (the
    ``--json`` object) and the command's exit status."""

    artifact: Path
    doc: dict[str, Any]
    exit_code: int
    error: str

    @property
    def proof(self) -> FoldProof:
        return FoldProof.from_json(self.doc["proof"])

    def summary(self) -> str:
        """One line for the UI, as ``FoldResult.summary`` (an unproven proof said to be)."""
        return fold_summary(self.doc, self.proof.headline())


def fold_in_child(src: str | Path, root: Path, roles_path: str | None = None,
                  shapes: dict[str, tuple[int, ...]] | None = None, on_line: Callable[[str], None] | None = None
                  ) -> Folded:
    """``qfold fold SRC OUT --json`` in a child. A package goes through the fold cache of ``root``
    (``--builds-dir``): the folded package is the cache entry's, and OUT, the command's copy, is removed. A Core AI
    asset (the command caches none) is written under ``<root>/.folds/dashboard-<digest>/`` with the command's report
    and proof as its ``fold.json``, so the dashboard's pages know it as a fold of ``src``. Raises
    :class:`QfoldError` with the command's error line when it printed no report."""
    src = Path(src)
    asset = src.suffix == ".aimodel"
    size = asset_bytes(src)
    limit = _limit(FOLD_SECONDS_PER_GB * size / 1e9, f"for {size / 1e9:.2f} GB")
    tag = hashlib.sha256(f"{src.resolve()}|{sorted((shapes or {}).items())}|{roles_path}".encode()).hexdigest()[:16]
    # --allow-unproven: a fold whose proof could not run is kept and shown as unproven (the page says so), never
    # hidden; one the proof finds wrong is refused by the command whatever the flags, and nothing is cached
    options = ["--allow-unproven", *(["--input-spec", roles_path] if roles_path else []),
               *(f"--shape={n}={','.join(map(str, d))}" for n, d in (shapes or {}).items())]
    if asset:
        return _fold_asset_in_child(src, root / FOLDS_DIR, f"dashboard-{tag}", options, limit, on_line)
    scratch = Path(tempfile.mkdtemp(prefix="qfold-dashboard-fold-"))
    try:
        run = run_cli(["fold", str(src), str(scratch / PACKAGE_NAME), "--json", "--builds-dir", str(root), *options],
                      limit, on_line)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    cache = run.doc.get("cache") if isinstance(run.doc, dict) else None
    artifact = Path(cache["path"]) / PACKAGE_NAME if isinstance(cache, dict) else None
    if artifact is None or not artifact.is_dir():  # no report, or a fold the command refused (nothing cached)
        raise QfoldError(run.error or f"{run.command}: exit status {run.exit_code}, no folded package")
    return Folded(artifact, run.doc, run.exit_code, run.error)


def _fold_asset_in_child(src: Path, folds: Path, key: str, options: list[str], limit: tuple[float, str],
                         on_line: Callable[[str], None] | None) -> Folded:
    """The asset case of :func:`fold_in_child`: written into ``.tmp-<key>-<pid>`` under its key lock, with its
    ``fold.json``, then renamed into place (nothing half-written is ever listed)."""
    folds.mkdir(parents=True, exist_ok=True)
    folder = folds / key
    with key_lock(folds, key):
        tmp = tmp_folder(folds, key)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            run = run_cli(["fold", str(src), str(tmp / ASSET_NAME), "--json", *options], limit, on_line)
            if not isinstance(run.doc, dict) or not (tmp / ASSET_NAME).is_dir():  # no report, or refused
                raise QfoldError(run.error or f"{run.command}: exit status {run.exit_code}, no folded asset")
            report = {k: v for k, v in run.doc.items() if k not in ("input", "output", "proof")}
            record = {"key": key, "backend": "coreai", "source_name": src.name, "source_path": str(src.resolve()),
                      "created": datetime.now(UTC).isoformat(timespec="seconds"), "command": run.command,
                      "report": report, "proof": run.doc["proof"]}
            (tmp / FOLD_FILE).write_text(json.dumps(record))
            shutil.rmtree(folder, ignore_errors=True)
            os.rename(tmp, folder)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return Folded(folder / ASSET_NAME, run.doc, run.exit_code, run.error)


# ------------------------------------------------------------------------------------------------ bench
def bench_in_child(assets: list[Path], labels: list[str], steps: int, rounds: int, warmup: int, root: Path,
                   on_line: Callable[[str], None] | None = None) -> tuple[BenchResult, str]:
    """``qfold bench ASSET… --json --out LOG.csv`` in a child, one bench at a time per builds folder ``root``
    (the command waits for the folder's bench lock, saying ``waiting: …``): the result and its log rows (CSV)."""
    size = sum(asset_bytes(a) for a in assets)
    work = BENCH_SECONDS_PER_GB * size / 1e9 * (warmup + rounds + 2) * steps
    with tempfile.TemporaryDirectory(prefix="qfold-dashboard-bench-") as d:
        log = Path(d) / "bench.csv"
        args = ["bench", *map(str, assets), "--steps", str(steps), "--rounds", str(rounds), "--warmup", str(warmup),
                "--json", "--out", str(log), "--builds-dir", str(root), *(a for label in labels
                                                                            for a in ("--label", label))]
        run = run_cli(args, _limit(work, f"for {rounds + warmup} rounds of {steps} steps over {size / 1e9:.2f} GB"),
                      on_line)
        if run.exit_code != 0 or not isinstance(run.doc, dict) or not log.is_file():
            raise QfoldError(run.error or f"{run.command}: exit status {run.exit_code}")
        return BenchResult.from_json(run.doc), log.read_text()
