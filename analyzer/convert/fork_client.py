"""Conversion children forked from a process that has already imported them (Linux): the requesting side of the
fork server (:mod:`analyzer.convert.fork_server`).

A conversion child (``python -m analyzer.convert.child``) spends seconds of CPU importing torch, transformers and
coremltools before it does anything (bench/results/fork_server.json). A process that starts many children (the
dashboard, a test worker, a Ray worker of a sweep) would pay that for each. Here the first child request of a
process starts one server, which imports the child modules once and then forks a child per request.

What a forked child shares with the server, and what it does not:

* shared: the interpreter and every module the server imported (so the server's address names qfold's source
  digest and the versions of the libraries it imports: after an edit or an upgrade the next request gets a new
  server), the import-time environment, the cgroup and the group ids (all part of the address: a requester whose
  values differ gets a server of its own);
* not shared, its requester's: the resource limits, soft and hard (a CPU-time limit counts the child's own CPU from
  zero), the nice value, the OOM score adjustment, the CPU affinity, the umask, the working directory, the
  environment (``QFOLD_*``, ``PYTEST_*`` and Ray's notes may differ from the server's), stdin (``/dev/null``) and
  stdout/stderr (a pipe the requester reads); and its own session, so killing its process group stops it and
  everything it starts. A child can only lower a hard limit and raise its nice value and OOM adjustment, so a
  requester uses a running server only when the server's are not tighter than its own
  (``fork_address.cannot_serve``), else it starts one of its own.

The child is what ``subprocess.Popen`` would have started, with the part of its interface the launcher uses
(:class:`ForkedChild`). The server exits when the process that started it does (its stdin is that process's pipe)
or after :data:`~analyzer.convert.fork_server.IDLE_S` without a child.

A running server is shared: it also listens on an abstract Unix socket named after what makes a child the same
(:mod:`analyzer.convert.fork_address`), and a process with no server of its own first asks there, after checking
that the process listening is this user's fork server for that name (anything else is refused with one line and
the requester starts a server of its own). A server stops listening once its own process has gone.

Elsewhere (macOS: Apple's frameworks are not fork-safe) and when the server cannot start (one line says why),
children are started with ``subprocess.Popen``.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

from analyzer.convert.fork_address import (
    ServerRefused,
    bounds,
    cannot_serve,
    connect,
    own_limits,
    server_address,
    start_time,
)
from analyzer.convert.fork_server import MAX_MESSAGE, PRELOAD, READY

# How long a server may take to print READY: its imports, 3.8-4.8 s of CPU and 9.5-16 s of wall time on this
# 2-core machine at load 8-12 (bench/results/fork_server.json), given ~10x for a machine shared by many.
STARTUP_TIMEOUT_S = 180.0
REPLY_TIMEOUT_S = 60.0  # for a server's answer to a request: one fork (milliseconds) after what it is doing
EXIT_WAIT_S = 10.0  # how long a requester, as it exits, waits for its servers to end


def _warn(line: str, _said: set[str] = set()) -> None:  # noqa: B006  (the lines said so far, once each)
    if line not in _said:
        _said.add(line)
        print(f"qfold: {line}", file=sys.stderr, flush=True)


class ForkedChild:
    """A child forked by the server, with the part of ``subprocess.Popen``'s interface the launcher uses: ``pid``
    (its process group too), ``stdout`` (text, line by line), ``wait()``, ``poll()`` and ``kill()``. ``started``:
    its start time (``fork_address.start_time``) as the server read it right after the fork."""

    def __init__(self, pid: int, started: int | None, stdout: IO[str], channel: socket.socket):
        self.pid, self.started, self.stdout, self._channel = pid, started, stdout, channel
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def wait(self, timeout: float | None = None) -> int:
        with self._lock:
            if self.returncode is None:
                self._channel.settimeout(timeout)
                try:
                    data = self._channel.recv(MAX_MESSAGE)
                except TimeoutError:
                    raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0) from None
                # no message: the server itself died, so nobody can tell how the child ended (it is not ours)
                self.returncode = json.loads(data)["exit"] if data else -signal.SIGKILL
                self._channel.close()
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0.001)
        except subprocess.TimeoutExpired:
            return None

    def is_ours(self) -> bool:
        """Whether the pid still names this child, or no process at all: a pid is not reused while a process
        group of that id exists, so then the group, if any, is this child's."""
        now = start_time(self.pid)
        return now is None or now == self.started

    def kill(self) -> None:
        """SIGKILL to the child's process group (it and everything it started), unless its pid now names another
        process (the child ended, was reaped and the number reused)."""
        if not self.is_ours():
            return
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:  # forked a moment ago, not yet in its own session (so it has started nothing): the child alone
                os.kill(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class _Server:
    """The requesting side's handle on one running server, started by this process for ``address``."""

    def __init__(self, env: dict[str, str], cwd: str, address: bytes):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env, self.address = env, address
        self.errors = tempfile.TemporaryFile()  # its stderr: the reason, when it does not start
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "analyzer.convert.fork_server", str(theirs.fileno()), address.hex()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, env=env, cwd=cwd,
            pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        self.control, self.pid = ours, self.proc.pid
        self.why_not = self._wait_ready(STARTUP_TIMEOUT_S)
        self.ready = self.why_not is None
        if not self.ready:
            self.proc.kill()
            self.proc.wait()

    def _wait_ready(self, timeout_s: float) -> str | None:
        """None once the server printed READY, else why not (within ``timeout_s``: its imports)."""
        assert self.proc.stdout is not None
        fd, got, deadline = self.proc.stdout.fileno(), b"", time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while not any(ln.startswith(b"ready ") and ln.endswith(b"\n") for ln in got.splitlines(keepends=True)):
                if not sel.select(max(0.0, deadline - time.monotonic())):  # (an import may print a line first)
                    return f"no 'ready' within {timeout_s:.0f} s (its imports)"
                chunk = os.read(fd, 64)
                if not chunk:
                    break
                got += chunk
        lines = got.splitlines(keepends=True)
        if READY in lines:
            return None
        if any(ln.startswith(b"ready ") for ln in lines):
            return ("its code is not this process's (qfold's fork server modules changed on disk since this process "
                    "imported them)")
        code = self.proc.wait()
        self.errors.seek(0)
        last = [ln.strip() for ln in self.errors.read().decode(errors="replace").splitlines() if ln.strip()]
        return f"it exited with code {code}" + (f": {last[-1][:300]}" if last else "")

    def alive(self) -> bool:
        return self.ready and self.proc.poll() is None

    def request(self, module: str, args: list[str], env: dict[str, str], cwd: str) -> ForkedChild:
        """Fork a child running ``module`` with ``args``; raises OSError when the server is gone or does not
        answer within :data:`REPLY_TIMEOUT_S`."""
        mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_end, write_end = os.pipe()
        try:
            message = json.dumps({"module": module, "args": args, "env": env, "cwd": cwd,
                                  "limits": own_limits()}).encode()
            socket.send_fds(self.control, [message], [its.fileno(), write_end])
        finally:
            its.close()
            os.close(write_end)
        mine.settimeout(REPLY_TIMEOUT_S)
        try:
            reply = mine.recv(MAX_MESSAGE)
        except TimeoutError:
            reply = b""
        mine.settimeout(None)
        if not reply:
            os.close(read_end)
            mine.close()
            raise OSError("the fork server ended (or did not answer) before it forked the child")
        stdout = open(read_end, encoding="utf-8", errors="replace", newline=None)  # the caller reads and closes it
        answer = json.loads(reply)
        return ForkedChild(answer["pid"], answer.get("start"), stdout, mine)

    def close(self) -> None:
        """Stop the server: it forks nothing more and exits once its running children have ended (their
        requesters still learn how they ended)."""
        self.control.close()
        self.errors.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the server's lifeline


class _Shared(_Server):
    """A connection to a server another process started (at ``fork_address.server_address``), checked by
    ``fork_address.connect``; closing it closes only the connection. ``proc`` is None: the process that started
    the server reaps it."""

    def __init__(self, env: dict[str, str], address: bytes, control: socket.socket, pid: int):
        self.env, self.address, self.control, self.proc, self.ready, self.pid = env, address, control, None, True, pid

    def alive(self) -> bool:
        return self.control.fileno() >= 0

    def close(self) -> None:
        self.control.close()


def _connect(env: dict[str, str], address: bytes, mine: dict) -> _Shared | None:
    """A connection to the running server at ``address``, if one of this user's listens there (anything else
    listening is refused, one line) and its limits can reach this process's (``fork_address.cannot_serve``)."""
    try:
        got = connect(address)
    except ServerRefused as e:
        _warn(f"{e}: not used; this process starts a fork server of its own")
        return None
    if got is None:
        return None
    if _cannot_serve(got[1], mine):  # e.g. this process runs at a lower nice value: a server of its own
        got[0].close()
        return None
    return _Shared(env, address, *got)


def _cannot_serve(pid: int, mine: dict) -> str | None:
    try:
        return cannot_serve(bounds(pid), mine)
    except OSError as e:  # gone
        return str(e)


_SERVER: _Server | None = None
_SERVER_LOCK = threading.Lock()
_CLOSED: list[_Server] = []  # servers told to stop, not yet reaped
_FAILED: set[bytes] = set()  # addresses whose server did not start in this process: Popen from then on


def _retire_server() -> None:
    """Tell this process's server to stop (it exits once its running children have ended) and keep it to be reaped
    (``stop_servers``). Call with ``_SERVER_LOCK`` held."""
    global _SERVER
    if _SERVER is not None:
        _SERVER.close()
        if _SERVER.proc is not None:  # a shared server is reaped by the process that started it
            _CLOSED.append(_SERVER)
        _SERVER = None


def stop_servers(wait_s: float = EXIT_WAIT_S) -> None:
    """Stop this process's servers and wait up to ``wait_s`` for them to end (at exit, too): a server is reaped by
    its requester, as a Popen'd child would be, so no zombie remains and its CPU time (with its children's) is
    counted in the requester's (``time``, ``RUSAGE_CHILDREN``). A server whose child still runs is left to exit
    when that child has."""
    with _SERVER_LOCK:
        _retire_server()
        deadline = time.monotonic() + wait_s
        for server in _CLOSED:
            try:
                server.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        _CLOSED[:] = [s for s in _CLOSED if s.proc.poll() is None]


atexit.register(stop_servers)


def start_child(cmd: list[str], env: dict[str, str], cwd: str | Path):
    """Start ``cmd`` in its own session with stdout and stderr on one text pipe. ``python -m M ...`` of a module the
    server preloads (:data:`~analyzer.convert.fork_server.PRELOAD`) becomes a :class:`ForkedChild` of the fork
    server for this process's code, limits and environment on Linux; anything else (or when the server cannot
    start) a ``subprocess.Popen``."""
    global _SERVER
    module = cmd[2] if len(cmd) > 2 and cmd[:2] == [sys.executable, "-m"] else None
    if sys.platform.startswith("linux") and module in PRELOAD:
        address, mine = server_address(env), bounds()  # this process's code, libraries and limits as they are now
        with _SERVER_LOCK:
            for _ in range(2):  # a server that went idle between our check and the request: start another
                if _SERVER is None or not _SERVER.alive() or _SERVER.address != address or \
                        _cannot_serve(_SERVER.pid, mine):
                    _retire_server()
                    if address in _FAILED:
                        break
                    _SERVER = _connect(env, address, mine) or _Server(env, str(cwd), address)
                if not _SERVER.ready:
                    _warn(f"the fork server did not start ({_SERVER.why_not}); children start as new processes")
                    _FAILED.add(address)
                    _retire_server()
                    break
                try:
                    return _SERVER.request(module, cmd[3:], env, str(cwd))
                except OSError:
                    _retire_server()
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(cwd),
                            bufsize=1, start_new_session=True)
