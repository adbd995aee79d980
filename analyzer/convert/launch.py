"""Builds: one folder per content-hashed key under ``builds/``, made by a child process, reused when present.

Two build modes (:data:`BUILD_MODES`), part of the key: ``analysis`` converts with value-free weights (shapes and
dtypes, no values: ``analyzer.convert.header_blobs``) and keeps only the analysis; ``materialised`` converts real or
seeded random weights and keeps a runnable ``model.mlpackage``. Both give the same analysis, op for op.

A build folder holds ``analysis.json`` and ``build.log`` (and ``model.mlpackage`` when materialised). The child
(``python -m analyzer.convert.child``) writes into ``builds/.tmp-<key>-<pid>/`` and renames it into place only
when everything is written, so an interrupted build never leaves a folder that looks finished. Shared
state lives on disk with file locks (several Streamlit sessions and CLIs may build at once): one lock per
key (two requests for the same build wait for one conversion) and one machine-wide conversion lock
(a full-size materialised conversion needs ~15 GB: bench/results/full_size.json; analysis mode ~1-2 GB:
bench/results/fast.json), so further conversions queue.
"""

from __future__ import annotations

import json
import os
import queue as queue_mod
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from analyzer.analysis.record import (
    ANALYSIS_FILE,
    Analysis,
    function_analysis_files,
    load_analysis,
    read_analysis_file,
    write_analysis,
)
from analyzer.convert.builds_folder import request_paths
from analyzer.convert.fork_client import ForkedChild, start_child
from analyzer.convert.progress import PROGRESS_PREFIX
from analyzer.errors import BuildError, QfoldError
from analyzer.fsio import file_kind, resolved
from analyzer.ir.coreai.walk import read_asset
from analyzer.ir.coreml.mil_reader import read_program
from analyzer.model.backends import COREML, require_coreai
from analyzer.model.cost import check_request, estimate
from analyzer.model.sources import load_config, safetensors_shapes
from analyzer.model.spec import BuildSpec

PACKAGE_NAME = "model.mlpackage"
ASSET_NAME = "model.aimodel"  # a Core AI build's asset (analyzer.ir.coreai), beside analysis.json
LOG_FILE = "build.log"
REPO_ROOT = Path(__file__).resolve().parents[2]
# A conversion child's time limit, scaled to its work: TIMEOUT_FIXED_S + TIMEOUT_FACTOR x the cost model's wall time
# of its builds (analyzer.model.cost.estimate, fitted on this 2-core machine at load 2-6). 20x covers a machine
# shared by many (load 17 here slowed builds ~8x); the fixed part covers imports, the equivalence check and a fold's
# proof. Time spent queued (waiting for another conversion or another request's identical build) is not counted.
TIMEOUT_FACTOR = 20.0
TIMEOUT_FIXED_S = 600.0


def builds_dir(path: str | Path | None = None) -> Path:
    """``--builds-dir``, else ``$QFOLD_BUILDS``, else ``builds/`` of the checkout the code runs from, else (an
    installed qfold, whose code lives in site-packages) ``./builds`` in the working directory; refused (one line)
    when it, or the nearest part of it that exists, is not a folder."""
    checkout = REPO_ROOT / "builds" if (REPO_ROOT / "pyproject.toml").is_file() else Path.cwd() / "builds"
    # absolute: the conversion child runs in the checkout, not in the caller's working directory
    folder = Path(path or os.environ.get("QFOLD_BUILDS") or checkout).absolute()
    existing = next((p for p in (folder, *folder.parents) if p.exists() or p.is_symlink()), None)
    if existing is not None and not existing.is_dir():
        what = "the builds folder" if existing == folder else f"its parent {existing}"
        raise QfoldError(f"{folder}: {what} is not a folder ({file_kind(existing.lstat().st_mode)})")
    return folder


@dataclass(frozen=True, slots=True)
class Progress:
    fraction: float
    stage: str
    message: str


@dataclass(frozen=True, slots=True)
class BuildResult:
    key: str
    path: Path
    reused: bool
    seconds: float


def build_path(spec: BuildSpec, root: str | Path | None = None) -> Path:
    return builds_dir(root) / spec.key


def is_complete(path: Path) -> bool:
    return (path / ANALYSIS_FILE).is_file()


def run_build(spec: BuildSpec, root: str | Path | None = None,
              on_progress: Callable[[Progress], None] | None = None,
              timeout_s: float | None = None, force_ctx: bool = False) -> BuildResult:
    """Return the build for ``spec``, converting it in a child process unless it already exists. A request
    that cannot work (absurd sizes, more memory than the limit, ctx past the model's positions unless
    ``force_ctx``) is refused here, before the child starts."""
    return run_builds([spec], root, on_progress, timeout_s, force_ctx)[0]


def run_builds(specs: list[BuildSpec] | tuple[BuildSpec, ...], root: str | Path | None = None,
               on_progress: Callable[[Progress], None] | None = None,
               timeout_s: float | None = None, force_ctx: bool = False) -> list[BuildResult]:
    """Return the builds for ``specs`` (in order), converting the missing ones in ONE child process: the two
    variants of an A/B share its process, its equivalence check and (analysis mode) one value-free model.
    Every missing build is checked against the cost model first (``analyzer.model.cost.check_request``)."""

    t0 = time.monotonic()
    root = builds_dir(root)
    if not specs:
        return []
    missing = [s for s in dict.fromkeys(specs) if not is_complete(root / s.key)]
    for s in missing:
        if s.backend != COREML:
            require_coreai(compression=bool(s.compression))
        check_request(load_config(s.source), s.ctx, force_ctx=force_ctx, mode=s.build_mode, backend=s.backend,
                      weights=s.weights, builds=len(missing), phase=s.phase, q_len=s.q_len,
                      compressed=s.compression is not None)
    for source in dict.fromkeys(s.source for s in missing):  # an A/B's variants share one source: read it once
        safetensors_shapes(source)  # headers only: a corrupt weights file is refused before a child starts
    limit = (timeout_s, "as given") if timeout_s is not None else work_timeout(missing)
    outcomes = _convert_in_child(missing, root, on_progress, limit, t0) if missing else {}
    seconds = time.monotonic() - t0
    built = {k for k, outcome in outcomes.items() if outcome == "built"}
    return [BuildResult(s.key, root / s.key, s.key not in built, seconds if s.key in built else 0.0) for s in specs]


def run_folded_build(spec: BuildSpec, root: str | Path | None = None,
                     on_progress: Callable[[Progress], None] | None = None,
                     timeout_s: float | None = None) -> BuildResult:
    """The ``repeat_kv+fold`` build of ``spec``, a ``repeat_kv`` spec built first (``run_builds``): folded,
    proven and written beside it by a child process (``analyzer.fold.fold_child``), so that the fold pass's
    coremltools loads there and not in the caller."""
    t0 = time.monotonic()
    root = builds_dir(root)
    cmd, log_path = _child_request(root, f"{spec.key}-fold", spec.to_json(), "analyzer.fold.fold_child")
    limit = (timeout_s, "as given") if timeout_s is not None else work_timeout([spec])
    outcomes = run_child(f"{spec.key} (folded)", cmd, log_path, on_progress, *limit, t0=t0)
    if len(outcomes) != 1 or not is_complete(root / next(iter(outcomes))):
        raise BuildError(f"fold of {spec.key} failed: the fold ended without a finished build (log: {log_path})")
    ((key, outcome),) = outcomes.items()
    return BuildResult(key, root / key, outcome == "reused", 0.0 if outcome == "reused" else time.monotonic() - t0)


def work_timeout(specs) -> tuple[float, str]:
    """(seconds, how they were set): how long the child converting ``specs`` may work, :data:`TIMEOUT_FIXED_S` +
    :data:`TIMEOUT_FACTOR` x the estimated wall time of each build (a fold: of its repeat_kv build)."""
    work = sum(estimate(load_config(s.source), s.ctx, s.build_mode, s.backend, s.weights).wall_s for s in specs)
    return (TIMEOUT_FIXED_S + TIMEOUT_FACTOR * work,
            f"{TIMEOUT_FIXED_S:.0f} s + {TIMEOUT_FACTOR:.0f} x the estimated {work:.0f} s of its builds")


def _convert_in_child(specs: list[BuildSpec], root: Path, on_progress, limit: tuple[float, str],
                      t0: float) -> dict[str, str]:
    """Convert ``specs`` in one child; returns key → "built" or "reused" (an identical request elsewhere may
    have finished a build while this one waited for its key lock)."""
    name = specs[0].key if len(specs) == 1 else f"{specs[0].key}+{len(specs) - 1}"
    cmd, log_path = _child_request(root, name, {"specs": [s.to_json() for s in specs]}, "analyzer.convert.child")
    what = specs[0].key if len(specs) == 1 else " + ".join(s.key for s in specs)
    outcomes = run_child(what, cmd, log_path, on_progress, *limit, t0=t0)
    unfinished = [s.key for s in specs if not is_complete(root / s.key)]
    if unfinished:
        raise BuildError(f"build {' + '.join(unfinished)} failed: the conversion ended without a finished build "
                         f"(log: {log_path})")
    return {s.key: outcomes.get(s.key, "built") for s in specs}


def _child_request(root: Path, name: str, request: dict, module: str) -> tuple[list[str], Path]:
    """(command, log path) of a child ``module`` run on ``request``, written to its own request file in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    path, log_path = request_paths(root, name)
    path.write_text(json.dumps(request, indent=1))
    return [sys.executable, "-m", module, str(path), str(root)], log_path


def child_env() -> dict[str, str]:
    """The environment a conversion child gets: this process's, with the checkout on ``PYTHONPATH`` (the child runs
    ``python -m analyzer...`` from it), once: a caller started with it there already (a Ray worker, a script) asks
    the same fork server as one that was not. A fork server serves requests of one import-time environment, so
    whatever starts a child the launcher's way passes this one (tests/test_builds_folder.py)."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(REPO_ROOT)]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *rest]))


def run_child(what: str, cmd: list[str], log_path: Path, on_progress: Callable[[Progress], None] | None = None,
              timeout_s: float | None = None, timeout_why: str = "as given",
              t0: float | None = None) -> dict[str, str]:
    """Run the conversion child ``cmd`` (building ``what``), relaying its progress; returns what it did per key
    (``{"result": "built"|"reused", "key": K}`` lines). The child runs in its own session, so a timeout or an
    interrupt stops it and every process it started (the equivalence worker). ``timeout_s`` is the time it may
    work (``timeout_why``: how it was set): the clock stops while the child reports it is queued (its ``queued``
    progress lines, every 5 s), and the timeout holds even while it prints nothing (its output is read by a thread);
    the error line says the limit, how it was set and what the child was doing. On Linux a conversion child is
    forked by the fork server (``analyzer.convert.fork_client``), which has imported the child's modules already."""

    t0 = time.monotonic() if t0 is None else t0
    env = child_env()
    lines: queue_mod.Queue[str | None] = queue_mod.Queue()
    last_error, outcomes, doing = "", {}, "starting"
    deadline, queued_since = None if timeout_s is None else t0 + timeout_s, None
    with log_path.open("w") as log:
        proc = start_child(cmd, env, REPO_ROOT)
        assert proc.stdout is not None

        def pump(stream=proc.stdout) -> None:
            for line in stream:
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True, name="qfold-build").start()
        try:
            while True:
                deadline, queued_since = _unqueued(deadline, queued_since)
                try:
                    line = lines.get(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
                except queue_mod.Empty:
                    raise BuildError(f"build {what} timed out after {timeout_s:.0f} s of work (its limit, "
                                     f"{timeout_why}) while {doing}; log: {log_path}") from None
                deadline, queued_since = _unqueued(deadline, queued_since)  # queued up to this line
                if line is None:
                    break
                log.write(line)
                log.flush()
                if not line.startswith(PROGRESS_PREFIX):
                    continue
                try:
                    msg = json.loads(line[len(PROGRESS_PREFIX):])
                except json.JSONDecodeError:
                    continue
                if msg.get("error"):
                    last_error = msg["error"]
                elif msg.get("result"):
                    outcomes[str(msg.get("key", ""))] = msg["result"]
                else:
                    queued = msg.get("stage") == "queued"
                    queued_since = (queued_since or time.monotonic()) if queued else None
                    doing = f"{msg.get('stage')}: {str(msg.get('message', ''))[:200]}"
                    if on_progress is not None:
                        on_progress(Progress(msg["fraction"], msg["stage"], msg["message"]))
            code = proc.wait()
        except BaseException:
            _stop(proc)
            raise
    if code != 0:
        reason = last_error or _last_line(log_path) or f"exit code {code}"
        raise BuildError(f"build {what} failed: {reason} (log: {log_path})")
    return outcomes


def _unqueued(deadline: float | None, queued_since: float | None) -> tuple[float | None, float | None]:
    """The deadline moved on by the time queued since ``queued_since`` (the work clock stands still meanwhile)."""
    if queued_since is None or deadline is None:
        return deadline, queued_since
    now = time.monotonic()
    return deadline + now - queued_since, now


def _stop(proc: subprocess.Popen | ForkedChild) -> None:
    """Kill a conversion child and everything it started (its own process group; a forked child's pid is checked
    against its start time first: ``ForkedChild.kill``)."""

    if isinstance(proc, ForkedChild):
        proc.kill()
    else:
        try:  # a Popen'd child's pid is not reused before this process has waited for it
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
    proc.wait()


def _last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


# ------------------------------------------------------------------------------------------------- reading
def list_builds(root: str | Path | None = None) -> list[Analysis]:
    """Finished builds, newest first (a folder whose analysis cannot be read is left out: see
    :func:`unreadable_builds`)."""
    return _scan_builds(root)[0]


def unreadable_builds(root: str | Path | None = None) -> list[tuple[Path, str]]:
    """Finished-looking build folders whose analysis cannot be read, with the reason (one line each): listed by
    the dashboard as unreadable, while every other build works as usual."""
    return _scan_builds(root)[1]


# What reading a corrupt or foreign analysis.json can raise beyond QfoldError: one poisoned folder must never take
# the listing (and every page that lists builds) down with it.
_UNREADABLE = (QfoldError, OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError)


# analysis.json → (its inode, size and mtime, what it read as). Every dashboard rerun lists the builds folder; parsing
# every analysis again took 1.0 s for the test suite's 31 builds (30-layer analyses hold ~3,000 op records), on each
# click. A file is read again when any of the three changes (a rewrite renames a new file into place); the entries
# of folders no longer listed are dropped, so the cache holds what one listing returns anyway.
_LISTED: dict[Path, tuple[tuple[int, int, int], Analysis]] = {}
_LISTED_LOCK = threading.Lock()


def _read_listed(d: Path) -> Analysis:
    f = d / ANALYSIS_FILE
    st = f.stat()
    stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _LISTED.get(f)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    analysis = read_analysis_file(d)
    with _LISTED_LOCK:
        _LISTED[f] = (stamp, analysis)
    return analysis


def _scan_builds(root: str | Path | None) -> tuple[list[Analysis], list[tuple[Path, str]]]:
    out, bad = [], []
    folder = builds_dir(root)
    try:
        entries = sorted(folder.iterdir()) if folder.is_dir() else []
    except OSError:
        entries = []
    with _LISTED_LOCK:
        listed = set(entries)
        for f in [f for f in _LISTED if f.parent.parent == folder and f.parent not in listed]:
            del _LISTED[f]
    for d in entries:
        if d.name.startswith(".") or not is_complete(d):
            continue
        try:
            analysis = _read_listed(d)
            created = analysis.build.created if analysis.build else ""
            if not isinstance(created, str):
                raise TypeError(f"build.created is {type(created).__name__}, not text")
        except _UNREADABLE as e:
            bad.append((d, str(e).splitlines()[0] if str(e) else type(e).__name__))
            continue
        if analysis.build is not None:
            out.append(analysis)
    return sorted(out, key=lambda a: a.build.created if a.build else "", reverse=True), bad


def build_folder(analysis: Analysis) -> Path:
    """The build folder an analysis was read from."""
    return Path(analysis.file).parent


def load_bytes_per_token(path: str | Path) -> int:
    """Total logical bytes per decode token of a build folder, an analysis.json or any .mlpackage."""

    return load_analysis(path).bytes_per_token.total


def reanalyze(path: str | Path, root: str | Path | None = None) -> Analysis:
    """Rewrite an analysis with this version's walker: a build folder's saved package is walked again; an
    ``analysis.json`` without a package (a shipped one, or an analysis-mode build, which keeps none) has its
    stored ops' facts derived again (schema migration). Build metadata (spec, timings, equivalence) is kept.

    A file reached through a symbolic link is rewritten at the link's target, and only when that target lies
    under the builds folder ``root``; elsewhere it is refused (a link is never replaced by a regular file, nor
    a file outside the builds folder rewritten through one)."""
    p = Path(path)
    file = p / ANALYSIS_FILE if p.is_dir() else p
    package, asset = file.parent / PACKAGE_NAME, file.parent / ASSET_NAME
    files = function_analysis_files(p) if p.is_dir() else (file,)  # every function of a multi-function build
    targets = [_rewrite_target(Path(f), root) for f in files]
    for f, target in zip(files, targets, strict=True):
        old = read_analysis_file(f)
        if p.is_dir() and package.is_dir():
            fresh = replace(old, program=replace(read_program(package, old.function), path=PACKAGE_NAME))
        elif p.is_dir() and asset.is_dir():  # a Core AI build: its asset walked again
            fresh = replace(old, program=replace(read_asset(asset), path=ASSET_NAME))
        else:
            fresh = old
        write_analysis(target, fresh)
    return read_analysis_file(file)


def _rewrite_target(f: Path, root: str | Path | None) -> Path:
    real = resolved(f)
    if real == Path(os.path.abspath(f)):
        return f
    builds = resolved(builds_dir(root))
    if builds not in real.parents:
        raise QfoldError(f"{f}: reached through a symbolic link to {real}, outside the builds folder {builds}; "
                         "refusing to rewrite it (reanalyze the file itself)")
    return real
