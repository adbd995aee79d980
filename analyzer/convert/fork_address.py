"""Where a fork server listens (an abstract Unix socket), whom it serves and whom a requester trusts.

Two processes may share a server (:mod:`analyzer.convert.fork_server`) only when a child it forks is the child either
would have started itself. The socket's name holds the user's id and a hash of what a child cannot change once forked:

* the interpreter, and the code it imported: qfold's own source as it is on disk now (:func:`code_digest`: a content
  hash, so a server started before an edit or an upgrade is never asked again) and the versions of the libraries
  the child imports (:data:`VERSIONED`: coremltools, torch, transformers, numpy, Core AI);
* the import-time environment (:func:`import_time_env`);
* what a forked child can never change: the cgroup and the group ids (:func:`fixed_limits`).

What a child can take on by itself is sent with each request and applied after the fork (:func:`own_limits`): the
soft and hard resource limits (a CPU-time limit counts from the fork: a forked process's CPU counters start at
zero), the nice value, the OOM score adjustment, the CPU affinity and the umask; the child also takes the
requester's working directory and environment. A child can lower a hard limit and raise its nice value or OOM
adjustment, never the reverse, so a requester uses a server only when the server's :func:`bounds` allow its own
(:func:`cannot_serve`), else it starts a server of its own: a Ray worker (nice 19, OOM adjustment 1000) forks its
builds from its driver's server; a driver never from its workers'.

Abstract names need no file to clean up and vanish with the server, but anyone may bind one first. Each side checks
the other: the server serves a peer of its own user only (``SO_PEERCRED``); a requester talks to a server only when
the peer is a process of its own user running ``python -m analyzer.convert.fork_server`` for that very name
(:func:`connect`), and refuses anything else with one line (:class:`ServerRefused`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import resource
import socket
import struct
import sys
from pathlib import Path

import analyzer

RUNTIME_ENV_PREFIXES = ("QFOLD_", "PYTEST_")  # read when used, never at import: may differ per request
SHELL_BOOKKEEPING = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})  # the shell's own notes (a child gets its own cwd)
# What ray.init() writes into its driver's environment and a Ray worker starts with: Ray's own settings (RAY_*),
# the debugger it hooks into breakpoint() (read at each call) and setproctitle's switch (SPT_NOENV). A child never
# imports Ray or setproctitle at load, so a driver after ray.init(), and its workers, ask the server they had before.
RAY_OWN_PREFIXES = ("RAY_",)
RAY_OWN_NAMES = frozenset({"PYTHONBREAKPOINT", "SPT_NOENV"})
_NOT_IMPORT_TIME_PREFIXES = (*RUNTIME_ENV_PREFIXES, *RAY_OWN_PREFIXES)
_NOT_IMPORT_TIME_NAMES = SHELL_BOOKKEEPING | RAY_OWN_NAMES
# The distributions a child imports (analyzer.convert.child, analyzer.fold.fold_child); a missing one is None.
VERSIONED = ("coremltools", "torch", "transformers", "numpy", "coreai-core", "coreai-torch")
SERVER_MODULE = "analyzer.convert.fork_server"
# Every resource limit this system has, once (RLIMIT_OFILE is RLIMIT_NOFILE's other name).
# The protocol a requester and a server speak: these three modules as this process imported them. A requester
# started before an edit (its code in memory) and a server started after it (the code on disk) would not understand
# each other: the name holds it, and a server announces its own when it is ready.
PROTOCOL = hashlib.sha256(b"".join((Path(__file__).parent / f"{m}.py").read_bytes()
                                   for m in ("fork_address", "fork_client", "fork_server"))).hexdigest()[:16]
RLIMITS = {name: r for r, name in {getattr(resource, n): n for n in sorted(dir(resource), reverse=True)
                                   if n.startswith("RLIMIT_")}.items()}


class ServerRefused(Exception):
    """The process listening at a server's name is not this user's fork server for it (one line: who it is)."""


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    """The variables a library may have read at import: every one but :data:`RUNTIME_ENV_PREFIXES`, the shell's
    bookkeeping (:data:`SHELL_BOOKKEEPING`, which differs between two commands of one terminal) and Ray's notes to
    its own processes (:data:`RAY_OWN_PREFIXES`, :data:`RAY_OWN_NAMES`)."""
    return {k: v for k, v in env.items()
            if not k.startswith(_NOT_IMPORT_TIME_PREFIXES) and k not in _NOT_IMPORT_TIME_NAMES}


# ------------------------------------------------------------------------------------------------ the code
_FILE_DIGESTS: dict[str, tuple[tuple[int, int, int, int], str]] = {}  # path → (its stat, its content's sha256)


def code_digest(root: Path | None = None) -> str:
    """A hash of the content of every ``.py`` file of qfold's package (``root``: the ``analyzer`` folder imported
    here). A file is read again only when its inode, size, mtime or ctime changed since this process last hashed
    it, so the digest of an unchanged tree costs one ``stat`` per file (~190 files: bench/results/fork_server.json;
    plain ``os`` calls: pathlib's took ~6x as long)."""
    top = str(root or Path(analyzer.__file__).resolve().parent)
    total = hashlib.sha256()
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:  # removed while listed
                continue
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            hit = _FILE_DIGESTS.get(path)
            if hit is None or hit[0] != stamp:
                with open(path, "rb") as f:
                    hit = _FILE_DIGESTS[path] = (stamp, hashlib.sha256(f.read()).hexdigest())
            total.update(f"{path[len(top):]}\0{hit[1]}\0".encode())
    return total.hexdigest()


_VERSIONS: tuple[tuple, dict[str, str | None]] | None = None  # (sys.path's folders' stats, the versions then)


def library_versions() -> dict[str, str | None]:
    """The installed version of each :data:`VERSIONED` distribution (None: not installed). Read again only when a
    folder on ``sys.path`` changed (installing or removing a distribution renames its ``.dist-info`` folder, which
    changes its folder's mtime): parsing the metadata costs ~10 ms a distribution on a busy machine."""
    global _VERSIONS
    stamp = tuple((p, st.st_ino, st.st_mtime_ns) for p in sys.path if p
                  for st in [_stat_or_none(p)] if st is not None)
    if _VERSIONS is None or _VERSIONS[0] != stamp:
        versions: dict[str, str | None] = {}
        for name in VERSIONED:
            try:
                versions[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                versions[name] = None
        _VERSIONS = (stamp, versions)
    return dict(_VERSIONS[1])


def _stat_or_none(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


# ------------------------------------------------------------------------------------------------ the limits
def fixed_limits() -> dict[str, object]:
    """What a forked child inherits from the server and can never change back (part of the address): the cgroup
    (moving needs write access to it) and the group ids."""
    return {"cgroup": _read("/proc/self/cgroup"), "gid": os.getgid(), "groups": sorted(os.getgroups())}


def bounds(pid: int = 0) -> dict[str, object]:
    """What a child can move in one direction only, of process ``pid`` (0: this one; another one of this user):
    the hard resource limits (lowered, never raised, without privileges), the nice value and the OOM score
    adjustment (raised, never lowered). Nice is per thread on Linux: this is the calling thread's, which is what a
    server it starts inherits."""
    return {"hard": {name: resource.prlimit(pid, r)[1] if pid else resource.getrlimit(r)[1]
                     for name, r in RLIMITS.items()},
            "nice": os.getpriority(os.PRIO_PROCESS, pid),
            "oom_score_adj": int(_read(f"/proc/{pid or 'self'}/oom_score_adj").strip() or 0)}


def cannot_serve(server: dict, requester: dict) -> str | None:
    """Why a server with :func:`bounds` ``server`` cannot fork a child with ``requester``'s (a hard limit below the
    requester's, a nice value or an OOM adjustment above it), else None."""
    for name, hard in requester["hard"].items():
        if _limit_key(server["hard"].get(name, resource.RLIM_INFINITY)) < _limit_key(hard):
            return f"its hard {name} is {server['hard'][name]}, below this process's {hard}"
    for what in ("nice", "oom_score_adj"):
        if server[what] > requester[what]:
            return f"its {what} is {server[what]}, above this process's {requester[what]}"
    return None


def _limit_key(value: int) -> float:
    return float("inf") if value == resource.RLIM_INFINITY else value


def own_limits() -> dict[str, object]:
    """What a forked child takes on from its requester (sent with each request, applied by :func:`apply_limits`):
    the soft and hard resource limits, the nice value, the OOM score adjustment, the CPU affinity and the umask."""
    return {"soft": {name: resource.getrlimit(r)[0] for name, r in RLIMITS.items()}, **bounds(),
            "affinity": sorted(os.sched_getaffinity(0)), "umask": _umask()}


def apply_limits(limits: dict) -> None:
    """In a forked child: take on the requester's :func:`own_limits` (the requester checked that the server's
    :func:`bounds` allow it: :func:`cannot_serve`)."""
    for name, soft in limits["soft"].items():
        resource.setrlimit(RLIMITS[name], (soft, limits["hard"][name]))
    if limits["nice"] != os.getpriority(os.PRIO_PROCESS, 0):
        os.setpriority(os.PRIO_PROCESS, 0, limits["nice"])
    if int(_read("/proc/self/oom_score_adj").strip() or 0) != limits["oom_score_adj"]:
        Path("/proc/self/oom_score_adj").write_text(str(limits["oom_score_adj"]))
    os.sched_setaffinity(0, limits["affinity"])
    os.umask(limits["umask"])


def check_limits(limits: object) -> bool:
    """Whether ``limits`` (from a request) has :func:`own_limits`' shape, with names this system knows."""
    if not isinstance(limits, dict):
        return False
    soft, hard = limits.get("soft"), limits.get("hard")
    return (isinstance(soft, dict) and isinstance(hard, dict) and set(soft) == set(hard) <= set(RLIMITS)
            and all(isinstance(v, int) for v in (*soft.values(), *hard.values()))
            and all(isinstance(limits.get(k), int) for k in ("nice", "oom_score_adj", "umask"))
            and isinstance(limits.get("affinity"), list) and bool(limits["affinity"])
            and all(isinstance(c, int) for c in limits["affinity"]))


def _umask() -> int:
    """This process's umask, read without setting it (``os.umask`` sets it, racing other threads' file creation)."""
    for line in _read("/proc/self/status").splitlines():
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    raise OSError("/proc/self/status has no Umask line (Linux < 4.7)")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


# ------------------------------------------------------------------------------------------------ the address
def server_address(env: dict[str, str]) -> bytes:
    """The abstract socket name of the server for ``env``, in this process as it is now (Linux). Computed per
    request: ~1.5 ms, median (bench/results/fork_server.json)."""
    what = json.dumps([sys.executable, PROTOCOL, code_digest(), library_versions(), fixed_limits(),
                       sorted(import_time_env(env).items())])
    return f"\0qfold-fork-server-{os.getuid()}-{hashlib.sha256(what.encode()).hexdigest()[:32]}".encode()


def listen(address: bytes | None) -> socket.socket | None:
    """A listening socket at ``address``, or None when another process already has the name (or there is none)."""
    if not address:
        return None
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        listener.bind(address)
        listener.listen(16)
    except OSError:
        listener.close()
        return None
    return listener


def connect(address: bytes) -> tuple[socket.socket, int] | None:
    """A connection to this user's server at ``address`` and the server's pid; None when nobody listens there.
    Raises :class:`ServerRefused` (nothing sent) when the listening process is of another user or is not
    ``python -m analyzer.convert.fork_server`` of this interpreter for that name: an abstract name is anyone's to
    take first, and a requester sends its environment and kills the pids it is told."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(address)
    except OSError:
        conn.close()
        return None
    try:
        pid, uid, _ = peer_credentials(conn)
        where = f"fork server socket @{address[1:].decode(errors='replace')}"
        if uid != os.getuid():
            raise ServerRefused(f"{where} is held by pid {pid} of uid {uid}, not this user (uid {os.getuid()})")
        argv = _cmdline(pid)
        if argv[:3] != [sys.executable, "-m", SERVER_MODULE] or argv[-1:] != [address.hex()]:
            shown = "".join(c for c in " ".join(" ".join(argv).split()) if c.isprintable())[:120] or \
                "a process whose command line cannot be read"  # one line, whatever its arguments hold
            raise ServerRefused(f"{where} is held by pid {pid} ({shown}), not qfold's fork server for it")
    except BaseException:
        conn.close()
        raise
    return conn, pid


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of ``conn`` (``SO_PEERCRED``: for a connection to a
    listening socket, the process that listened)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


def same_user(conn: socket.socket) -> bool:
    """Whether the process at the other end of ``conn`` runs as this process's user."""
    return peer_credentials(conn)[1] == os.getuid()


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]]


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/PID/stat`` field 22), None when there is no
    such process: with the pid, it names one process, not whichever later reuses the number."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2:].split()[19])  # fields from the 3rd on, after the command's name
