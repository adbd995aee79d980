"""The fork server: ``python -m analyzer.convert.fork_server CONTROL_FD ADDRESS_HEX`` (Linux), started by a
requesting process (:mod:`analyzer.convert.fork_client`, which says what a forked child shares with the server and
what it does not).

It imports the child modules (:data:`PRELOAD`) once, prints ``ready`` and then forks a child per request: on its
control socket (the process that started it) and, when it got the name, on the abstract socket ``ADDRESS``
(:mod:`analyzer.convert.fork_address`) for other processes of the same user. A forked child

* starts a session of its own (so killing its process group stops it and everything it starts);
* takes on the request's resource limits (soft and hard), nice value, OOM score adjustment, CPU affinity and umask
  (``fork_address.apply_limits``: the requester checked that this server's children can reach them), its working
  directory and its environment; stdin is ``/dev/null``, stdout and stderr the write end of a pipe the requester
  reads;
* runs its module as ``__main__`` with ``sys.argv`` as ``python -m`` sets it, and ends through the interpreter's
  own shutdown; its exit status is sent to the requester, which is not its parent.

The server runs with its starter's limits except its CPU-time limit, which it raises to the hard one: it serves
other requesters after its starter's children, and each child counts its own CPU time, from zero, under its own
requester's limit. It exits when its starter closes its stdin (or ends), once its running children have ended, or
after :data:`IDLE_S` without a child.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import resource
import runpy
import selectors
import signal
import socket
import sys
import time
import traceback
import warnings

from analyzer.convert import progress
from analyzer.convert.fork_address import PROTOCOL, apply_limits, check_limits, listen, same_user, start_time

PRELOAD = ("analyzer.convert.child", "analyzer.fold.fold_child")  # what a child imports; all of it, once
IDLE_S = 600.0
MAX_MESSAGE = 1 << 20
READY = f"ready {PROTOCOL}\n".encode()  # the server's first line: its imports are done, and its protocol


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
    try:
        apply_limits(request["limits"])
    except (OSError, ValueError) as e:  # a limit this child cannot take on: it does not run without it
        print(f"qfold fork server: the child cannot take on its requester's limits ({e}); not started", flush=True)
        return 1
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
    message, fds, _, _ = socket.recv_fds(conn, MAX_MESSAGE, 2)
    try:
        request = json.loads(message) if message and len(fds) == 2 else None
        if not isinstance(request, dict) or request.get("module") not in PRELOAD or not (
                isinstance(request.get("args"), list) and isinstance(request.get("env"), dict)
                and isinstance(request.get("cwd"), str) and check_limits(request.get("limits"))):
            raise ValueError(request)
        return {**request, "stdout_fd": fds[1]}, socket.socket(fileno=fds[0])
    except (ValueError, TypeError, OSError):  # OSError: the channel is not a socket
        for fd in fds:
            os.close(fd)
        return None


def serve(control_fd: int, address: bytes | None = None) -> None:
    cpu = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu[1], cpu[1]))  # each child sets its requester's (module docstring)
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
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
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
                try:  # its start time with its pid: the requester kills that process, not a later one of that pid
                    channel.send(json.dumps({"pid": pid, "start": start_time(pid)}).encode())
                except OSError:
                    pass  # the requesting process is gone; the child ends by itself (its stdout has no reader)
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
