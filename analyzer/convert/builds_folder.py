"""The builds folder's shared state: per-key locks, leftover ``.tmp-*`` folders, the queue, per-request logs.

Several Streamlit sessions, CLIs, sweep drivers and (on a shared volume) other hosts or containers may build into
one folder at once. Who owns what is decided by file locks (``flock``, via filelock), never by a pid alone: a pid
names a process only on its own host and is reused. The rules:

- whoever writes ``.tmp-<key>-<pid>/`` (a conversion, a sweep storing a worker's analysis, a ``repeat_kv+fold``
  build) holds ``.locks/<key>.lock`` from before it creates that folder until after it renamed or removed it, so
  a ``.tmp-*`` folder whose key lock is free is a killed build's leftover, safe to delete, whatever its pid;
- a queue entry (``.queue/<key>.<pid>.json``) exists only while its writer holds the same key lock, so an entry
  whose lock is free has no live owner: it is deleted when the queue is read;
- each request logs to its own ``.logs/<key>.<pid>-<token>.log``: a second request for the same build never
  truncates the first one's log.

Nothing here raises on a foreign name in the folder (a stray ``.tmp-x``, a file, a symlink, a suffix no pid can
have): what is not ours by these rules is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from filelock import FileLock, Timeout

from analyzer.fsio import write_json_atomic

LOCKS_DIR = ".locks"
QUEUE_DIR = ".queue"
LOGS_DIR = ".logs"
TMP_PREFIX = ".tmp-"
# ``.tmp-<key>-<pid>``: keys are ours (safe_label text, variant, kv, ctx, digest); anything else is not ours
_TMP_NAME = re.compile(r"^\.tmp-(?P<key>[A-Za-z0-9][A-Za-z0-9._+-]{0,200}[A-Za-z0-9])-(?P<pid>[0-9]{1,10})$")
_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,200}[A-Za-z0-9]$")


def key_lock(root: Path, key: str) -> FileLock:
    """The lock that owns build ``key`` in ``root``: held while it is converted, stored or folded."""
    if not _KEY.match(key):
        raise ValueError(f"not a build key: {key!r}")
    (root / LOCKS_DIR).mkdir(parents=True, exist_ok=True)
    return FileLock(str(root / LOCKS_DIR / f"{key}.lock"))


BENCH_LOCK = "bench.lock"  # in LOCKS_DIR: one bench at a time per builds folder (timings of two would mix)
BENCH_HOLDER = "bench.json"  # beside it: who holds it, for the others' "waiting for …"


@contextmanager
def bench_lock(root: Path, what: str, on_wait: Callable[[str], None]) -> Iterator[None]:
    """Hold the builds folder's bench lock while timing ``what``; while another process holds it, ``on_wait`` gets
    ``waiting for the bench of pid N (since HH:MM:SS UTC: …) to finish`` every 5 s."""
    (root / LOCKS_DIR).mkdir(parents=True, exist_ok=True)
    lock, holder = FileLock(str(root / LOCKS_DIR / BENCH_LOCK)), root / LOCKS_DIR / BENCH_HOLDER
    while True:
        try:
            lock.acquire(timeout=5)
            break
        except Timeout:
            on_wait(f"waiting for {_bench_holder(holder)} to finish")
    try:
        write_json_atomic(holder, {"pid": os.getpid(), "since": time.time(), "what": what})
        yield
    finally:
        holder.unlink(missing_ok=True)
        lock.release()


def _bench_holder(holder: Path) -> str:
    try:
        doc = json.loads(holder.read_text())
        since = time.strftime("%H:%M:%S", time.gmtime(float(doc["since"])))
        return f"the bench of pid {int(doc['pid'])} (since {since} UTC: {str(doc['what'])[:120]})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another bench"


def lock_is_held(root: Path, key: str) -> bool:
    """Whether some process (here or on another host sharing the folder) holds ``key``'s lock now. A lock this
    process holds through another file object also counts as held (flock locks are per open file)."""
    lock = key_lock(root, key)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    lock.release()
    return False


def tmp_folder(root: Path, key: str) -> Path:
    """Where build ``key`` is written before its one rename into ``root/<key>``; hold :func:`key_lock` first."""
    return root / f"{TMP_PREFIX}{key}-{os.getpid()}"


def clean_stale_tmp(root: Path, holding: Collection[str] = ()) -> list[Path]:
    """Delete ``.tmp-<key>-<pid>`` folders nobody is writing: their key lock is free, or their key is one of
    ``holding`` (keys whose lock the caller holds: any other folder of such a key is a previous, killed attempt).
    Returns what was deleted. Foreign names, files, symlinks and folders whose lock is held are left alone; never
    raises."""
    removed = []
    try:
        candidates = list(root.glob(f"{TMP_PREFIX}*"))
    except OSError:
        return removed
    for tmp in candidates:
        match = _TMP_NAME.match(tmp.name)
        try:
            if match is None or tmp.is_symlink() or not tmp.is_dir():
                continue
            key = match["key"]
            if key in holding:
                if int(match["pid"]) == os.getpid():
                    continue
            elif lock_is_held(root, key):
                continue
            shutil.rmtree(tmp, ignore_errors=True)
        except (OSError, ValueError):
            continue
        if not tmp.exists():
            removed.append(tmp)
    return removed


# ------------------------------------------------------------------------------------------------- the queue
@dataclass(frozen=True, slots=True)
class QueueEntry:
    """A conversion waiting for the machine-wide slot or running (a file in ``builds/.queue``, and one in the
    machine's :func:`machine_queue_dir`, which also names its builds folder)."""

    key: str
    pid: int
    state: str  # "queued" | "running"
    since_s: float  # Unix time it was queued
    root: str = ""  # the builds folder it converts into
    pid_start_s: float = 0.0  # its process's start time (a reused pid is not it)

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "pid": self.pid, "state": self.state, "since": self.since_s, "root": self.root,
                "pid_start": self.pid_start_s}


def queue_entry_path(root: Path, key: str) -> Path:
    return root / QUEUE_DIR / f"{key}.{os.getpid()}.json"


def write_queue_entry(path: Path, entry: QueueEntry) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, entry.to_json())


def _read_entry(path: Path) -> QueueEntry | None:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        entry = QueueEntry(str(d["key"]), int(d["pid"]), str(d["state"]), float(d["since"]), str(d.get("root", "")),
                           float(d.get("pid_start", 0.0)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    ok = _KEY.match(entry.key) and entry.pid > 0 and entry.state in ("queued", "running")
    return entry if ok else None


def queue(root: Path) -> list[QueueEntry]:
    """Conversions queued or running in ``root``, oldest first. An entry whose key lock nobody holds has no live
    owner (a killed build): its file is deleted. An unreadable or foreign entry is deleted too."""
    qdir = root / QUEUE_DIR
    out = []
    for f in sorted(qdir.glob("*.json")) if qdir.is_dir() else []:
        entry = _read_entry(f)
        if entry is None or not lock_is_held(root, entry.key):
            f.unlink(missing_ok=True)
            continue
        out.append(entry)
    return sorted(out, key=lambda e: e.since_s)


# The machine's conversions, whatever builds folder they convert into (another session's $QFOLD_BUILDS, a sweep's,
# the CLI's): one world-readable, sticky folder, an entry per conversion while its process lives.
MACHINE_QUEUE_ENV = "QFOLD_MACHINE_QUEUE"


def machine_queue_dir() -> Path:
    """``$QFOLD_MACHINE_QUEUE``, else ``qfold-conversions`` in the system's temporary folder."""
    return Path(os.environ.get(MACHINE_QUEUE_ENV) or Path(tempfile.gettempdir()) / "qfold-conversions")


def machine_entry_path(key: str) -> Path:
    return machine_queue_dir() / f"{os.getpid()}-{key}.json"


def write_machine_entry(entry: QueueEntry) -> None:
    """The entry in the machine's queue folder (created sticky and world-writable, like /tmp: every user's
    conversions are listed, and only its owner removes an entry). Best effort: a folder that cannot be written
    leaves the builds folder's own queue."""
    folder = machine_queue_dir()
    try:
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            folder.chmod(0o1777)
        write_json_atomic(machine_entry_path(entry.key), entry.to_json())
    except OSError:
        pass


def remove_machine_entry(key: str) -> None:
    with contextlib.suppress(OSError):
        machine_entry_path(key).unlink(missing_ok=True)


def _alive(entry: QueueEntry) -> bool:
    try:
        return abs(psutil.Process(entry.pid).create_time() - entry.pid_start_s) < 1.0
    except psutil.Error:
        return False


def machine_queue() -> list[QueueEntry]:
    """Every conversion queued or running on this machine (any builds folder, any user), oldest first; an entry
    whose process has gone (or whose pid now names another process) is removed where it can be."""
    folder = machine_queue_dir()
    out = []
    for f in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        entry = _read_entry(f)
        if entry is None or not _alive(entry):
            with contextlib.suppress(OSError):
                f.unlink(missing_ok=True)
            continue
        out.append(entry)
    return sorted(out, key=lambda e: e.since_s)


# ------------------------------------------------------------------------------------------------- logs
def request_paths(root: Path, key: str) -> tuple[Path, Path]:
    """(request file, log file) of one request for build ``key``, unique to it: ``.logs/<key>.<pid>-<token>.*``."""
    logs = root / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"{key}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return logs / f"{stem}.request.json", logs / f"{stem}.log"


def latest_log(root: Path, key: str) -> Path | None:
    """The newest request log of build ``key`` (the one a running conversion is writing), if any."""
    logs = [p for p in (root / LOGS_DIR).glob(f"{key}.*.log") if p.is_file()] if (root / LOGS_DIR).is_dir() else []
    return max(logs, key=lambda p: p.stat().st_mtime, default=None)
