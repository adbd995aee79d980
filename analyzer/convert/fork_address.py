"""Where a fork server listens (an abstract Unix socket) and whom it serves: the name says which children it forks.

Two processes may share a server (:mod:`analyzer.convert.fork_server`) only when a child it forks is the child either
would have started itself: the same user, the same interpreter, qfold's own files as they are on disk now (a server
started before an edit has the old code imported) and the same import-time environment. The socket's name is a
hash of those; abstract names need no file to clean up and vanish with the server. A connection is served only when
its peer runs as the same user (``SO_PEERCRED``).
"""

from __future__ import annotations

import hashlib
import json
import os
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


def import_time_env(env: dict[str, str]) -> dict[str, str]:
    """The variables a library may have read at import: every one but :data:`RUNTIME_ENV_PREFIXES`, the shell's
    bookkeeping (:data:`SHELL_BOOKKEEPING`, which differs between two commands of one terminal) and Ray's notes to
    its own processes (:data:`RAY_OWN_PREFIXES`, :data:`RAY_OWN_NAMES`)."""
    return {k: v for k, v in env.items()
            if not k.startswith(_NOT_IMPORT_TIME_PREFIXES) and k not in _NOT_IMPORT_TIME_NAMES}


def _code_files() -> list[tuple[str, int, int]]:
    root = Path(analyzer.__file__).resolve().parent
    return [(str(p), st.st_mtime_ns, st.st_size) for p in sorted(root.rglob("*.py")) for st in [p.stat()]]


def server_address(env: dict[str, str]) -> bytes:
    """The abstract socket name of the server for ``env`` (Linux)."""
    what = json.dumps([sys.executable, _code_files(), sorted(import_time_env(env).items())])
    return f"\0qfold-fork-server-{os.getuid()}-{hashlib.sha256(what.encode()).hexdigest()[:32]}".encode()


def listen(address: bytes | None) -> socket.socket | None:
    """A listening socket at ``address``, or None when another server already has the name (or there is none)."""
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


def connect(address: bytes) -> socket.socket | None:
    """A connection to the server listening at ``address``, if one does."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        conn.connect(address)
    except OSError:
        conn.close()
        return None
    return conn


def same_user(conn: socket.socket) -> bool:
    """Whether the process at the other end of ``conn`` runs as this process's user."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1] == os.getuid()
