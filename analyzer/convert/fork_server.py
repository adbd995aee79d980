"""Conversion children forked from a process that has already imported them (Linux): a fork server.

A conversion child (``python -m analyzer.convert.child``) spends ~9 s of CPU importing torch, transformers and
coremltools before it does anything (``-X importtime``: torch 4.5 s, transformers 1.7 s). A process that starts
many children (the dashboard, a test worker, a Ray worker of a sweep) pays that for each. Here the first child
request of a process starts one server, ``python -m analyzer.convert.fork_server``, which imports the child
modules once and then forks a child per request. The child is what ``subprocess.Popen`` would have started:

* its own session (so ``os.killpg(child.pid, SIGKILL)`` stops it and every process it starts, as before);
* stdin ``/dev/null``, stdout and stderr the write end of a pipe the requesting process reads;
* the requesting process's environment and working directory, and ``sys.argv`` as ``python -m`` sets it;
* its exit status reported back to the requesting process (``wait``), which is not its parent.

Only variables that qfold reads when it uses them may differ between a request and the server's own environment
(``QFOLD_*``, and pytest's per-test ``PYTEST_*``): any other one may have been read by a library at import (torch's
``OMP_NUM_THREADS``), so a request with another value gets a server started with it. The server exits when the
process that started it does (its stdin is that process's pipe) or after :data:`IDLE_S` without a child, so an idle
dashboard does not hold ~0.4 GB for nothing; the next request starts a new one.

A running server is shared: it also listens on an abstract Unix socket named after what makes a child the same
(:mod:`analyzer.convert.fork_address`: the user, the interpreter, qfold's own files as they are on disk, the
import-time environment), and a process with no server of its own first asks there. So a ``qfold build`` started
while the dashboard (or a test run) has a server forks its child from that server instead of importing everything
again (~8 s of CPU). Only a process of the same user is served; a server stops listening once its own process has
gone, and a requester whose server went away starts its own.

Elsewhere (macOS: Apple's frameworks are not fork-safe) and when the server cannot start, children are started with
``subprocess.Popen`` as before.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import IO

from analyzer.convert import progress
from analyzer.convert.fork_address import connect, import_time_env, listen, same_user, server_address

PRELOAD = ("analyzer.convert.child", "analyzer.fold.fold_child")  # what a child imports; all of it, once
IDLE_S = 600.0
EXIT_WAIT_S = 10.0  # how long a requester, as it exits, waits for its servers to end
_MAX_MESSAGE = 1 << 20


class ForkedChild:
    """A child forked by the server, with the part of ``subprocess.Popen``'s interface the launcher uses: ``pid``
    (its process group too), ``stdout`` (text, line by line), ``wait()``, ``poll()`` and ``kill()``."""

    def __init__(self, pid: int, stdout: IO[str], channel: socket.socket):
        self.pid, self.stdout, self._channel = pid, stdout, channel
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def wait(self, timeout: float | None = None) -> int:
        with self._lock:
            if self.returncode is None:
                self._channel.settimeout(timeout)
                try:
                    data = self._channel.recv(_MAX_MESSAGE)
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

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:  # forked a moment ago, not yet in its own session (so it has started nothing): the child alone
                os.kill(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


class _Server:
    """The requesting side's handle on one running server."""

    def __init__(self, env: dict[str, str], cwd: str):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "analyzer.convert.fork_server", str(theirs.fileno()), server_address(env).hex()],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd,
            pass_fds=(theirs.fileno(),), start_new_session=True)
        theirs.close()
        self.control = ours
        assert self.proc.stdout is not None
        self.ready = self.proc.stdout.readline() == b"ready\n"  # after the imports: ~10 s, as a child's own

    def alive(self) -> bool:
        return self.ready and self.proc.poll() is None

    def request(self, module: str, args: list[str], env: dict[str, str], cwd: str) -> ForkedChild:
        """Fork a child running ``module`` with ``args``; raises OSError when the server is gone."""
        mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_end, write_end = os.pipe()
        try:
            message = json.dumps({"module": module, "args": args, "env": env, "cwd": cwd}).encode()
            socket.send_fds(self.control, [message], [its.fileno(), write_end])
        finally:
            its.close()
            os.close(write_end)
        reply = mine.recv(_MAX_MESSAGE)
        if not reply:
            os.close(read_end)
            mine.close()
            raise OSError("the fork server ended before it forked the child")
        stdout = open(read_end, encoding="utf-8", errors="replace", newline=None)  # the caller reads and closes it
        return ForkedChild(json.loads(reply)["pid"], stdout, mine)

    def close(self) -> None:
        """Stop the server: it forks nothing more and exits once its running children have ended (their
        requesters still learn how they ended)."""
        self.control.close()
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # the server's lifeline


class _Shared(_Server):
    """A connection to a server another process started (at ``fork_address.server_address``); closing it closes
    only the connection. ``proc`` is None: the process that started the server reaps it."""

    def __init__(self, env: dict[str, str], control: socket.socket):
        self.env, self.control, self.proc, self.ready = env, control, None, True

    def alive(self) -> bool:
        return self.control.fileno() >= 0

    def close(self) -> None:
        self.control.close()


def _connect(env: dict[str, str]) -> _Shared | None:
    """A connection to the running server for ``env``, if there is one."""
    conn = connect(server_address(env))
    return None if conn is None else _Shared(env, conn)


_SERVER: _Server | None = None
_SERVER_LOCK = threading.Lock()
_CLOSED: list[_Server] = []  # servers told to stop, not yet reaped


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
    server preloads (:data:`PRELOAD`) becomes a :class:`ForkedChild` of the fork server on Linux; anything else (or
    when the server cannot start) a ``subprocess.Popen``."""
    global _SERVER
    module = cmd[2] if len(cmd) > 2 and cmd[:2] == [sys.executable, "-m"] else None
    if sys.platform.startswith("linux") and module in PRELOAD:
        with _SERVER_LOCK:
            for _ in range(2):  # a server that went idle between our check and the request: start another
                if _SERVER is None or not _SERVER.alive() or \
                        import_time_env(_SERVER.env) != import_time_env(env):
                    _retire_server()
                    _SERVER = _connect(env) or _Server(env, str(cwd))
                if not _SERVER.ready:
                    break
                try:
                    return _SERVER.request(module, cmd[3:], env, str(cwd))
                except OSError:
                    _retire_server()
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=str(cwd),
                            bufsize=1, start_new_session=True)


# ------------------------------------------------------------------------------------------------ the server
class _BecameChild(BaseException):  # not an error: the forked process leaving the server's code
    """Raised in a forked process once its module has run, so that it ends as ``python -m`` would: through the
    interpreter's own shutdown (atexit, thread and worker-pool shutdown), not ``os._exit``, which left the
    child's worker processes waiting for work forever."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _become_child(request: dict, sockets: list[socket.socket], selector: selectors.BaseSelector,
                  fds: set[int]) -> int:
    """In the forked process: drop the server's descriptors, become the child ``request`` describes and run its
    module as ``__main__``; returns its exit code."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    selector.close()
    for s in sockets:  # detached first: a socket object closed later must not close a descriptor reused since
        os.close(s.detach())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    for fd in (1, 2):
        os.dup2(request["stdout_fd"], fd)
    for fd in fds | {devnull, request["stdout_fd"]}:
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    progress.restart_clock()
    sys.argv = [request["module"], *request["args"]]
    # runpy warns that the module it runs as __main__ was imported before: by this server, on purpose (PRELOAD)
    warnings.filterwarnings("ignore", r".*found in sys\.modules after import of package", RuntimeWarning)
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)


def _fork(request: dict, sockets: list[socket.socket], selector: selectors.BaseSelector, fds: set[int]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _become_child(request, sockets, selector, fds)
        except BaseException:  # what `python -m` would have printed, then its exit code
            traceback.print_exc()
        raise _BecameChild(code)
    return pid


def _read_request(conn: socket.socket) -> tuple[dict, socket.socket] | None:
    """One request (its message, the child's channel and stdout descriptors): None when the connection closed or
    sent something that is not a request (its descriptors closed)."""
    message, fds, _, _ = socket.recv_fds(conn, _MAX_MESSAGE, 2)
    try:
        request = json.loads(message) if message and len(fds) == 2 else None
        if not isinstance(request, dict) or request.get("module") not in PRELOAD or not (
                isinstance(request.get("args"), list) and isinstance(request.get("env"), dict)
                and isinstance(request.get("cwd"), str)):
            raise ValueError(request)
        return {**request, "stdout_fd": fds[1]}, socket.socket(fileno=fds[0])
    except (ValueError, TypeError, OSError):  # OSError: the channel is not a socket
        for fd in fds:
            os.close(fd)
        return None


def serve(control_fd: int, address: bytes | None = None) -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    # What the imports made lives as long as the server and every child: out of the collector's sight (Python's
    # recipe for a process that forks without exec). A child's collections, coremltools' gc.collect() after every
    # conversion among them, then scan what the child itself made, not the ~350,000 objects of torch, coremltools
    # and transformers (a tiny conversion: ~1.3 → ~1.1 s of CPU).
    gc.collect()
    gc.freeze()
    control = socket.socket(fileno=control_fd)
    listener = listen(address)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "lifeline")
    selector.register(control, selectors.EVENT_READ, "request")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    if listener is not None:
        selector.register(listener, selectors.EVENT_READ, "accept")
    shared: set[socket.socket] = set()  # connections of other processes (_Shared)
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    idle_since, closing = time.monotonic(), False
    while not (closing and not children):
        for key, _ in selector.select(timeout=5.0):
            if key.data == "lifeline" and not os.read(0, 4096):
                closing = True  # the requesting process closed us or ended: fork nothing more
                selector.unregister(0)
            if key.data == "child":
                os.read(wake_r, 4096)
            if key.data == "accept" and not closing:
                conn, _ = listener.accept()
                if same_user(conn):
                    shared.add(conn)
                    selector.register(conn, selectors.EVENT_READ, "request")
                else:
                    conn.close()
            if key.data == "request":
                conn = key.fileobj
                got = None if closing else _read_request(conn)
                if got is None:
                    selector.unregister(conn)
                    if conn is control:
                        closing = True
                    else:
                        shared.discard(conn)
                        conn.close()
                    continue
                request, channel = got
                pid = _fork(request, [control, channel, *shared, *children.values(), *filter(None, [listener])],
                            selector, {wake_r, wake_w})
                os.close(request["stdout_fd"])
                channel.send(json.dumps({"pid": pid}).encode())
                children[pid] = channel
        if closing and listener is not None:  # nobody else may start to rely on a server that is going away
            for conn in (listener, *shared):
                selector.unregister(conn)
                conn.close()
            listener, shared = None, set()
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            channel = children.pop(pid, None)
            if channel is not None:
                try:
                    channel.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())
                except OSError:
                    pass  # the requesting process is gone
                channel.close()
        if children:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > IDLE_S:
            closing = True


if __name__ == "__main__":
    try:
        serve(int(sys.argv[1]), bytes.fromhex(sys.argv[2]) if len(sys.argv) > 2 else None)
    except _BecameChild as child:  # a forked child, its module run: exit as that module's process would
        sys.exit(child.code)
