"""Model Explorer served on 127.0.0.1 for a folder of exported files: a child process, its readiness, its end.

The child is :mod:`explorer_child` (Model Explorer's own command line in a process that ends when its parent
does). Its outbound HTTP goes to a closed local port (a proxy on 127.0.0.1:9, with 127.0.0.1 and localhost
exempt), so Model Explorer's check for a newer version on PyPI and GitHub never leaves the machine; the page
itself fetches only its web font from outside.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import weakref
from dataclasses import dataclass, field
from pathlib import Path

from analyzer.errors import QfoldError
from analyzer.report.explorer.explorer_bundle import HOST, Bundle

PACKAGE = "ai-edge-model-explorer"
VERSION = "0.1.34"
# numpy and torch in the same pip run, so they stay at qfold's pins
INSTALL_LINE = f'pip install "{PACKAGE}=={VERSION}" "numpy==2.3.5" "torch==2.13.0"'
READY_TIMEOUT_S = 90
HEALTH_TEXT = "model_explorer_ok"  # what its /check_health answers
NO_OUTSIDE = "http://127.0.0.1:9"  # the discard port: nothing listens, so a request through it fails at once
LOCAL_ADDRESSES = ("localhost", "127.0.0.1", "::1")


class ExplorerError(QfoldError):
    """Model Explorer is missing, its port is busy, or it did not start."""


def explorer_installed() -> bool:
    return importlib.util.find_spec("model_explorer") is not None


def is_local(address: str | None) -> bool:
    """A server address or a request's host that only this machine reaches (``localhost:8501`` → True)."""
    if not address:
        return False
    host = address.strip()
    if host.startswith("["):  # [::1]:8501
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return host.lower() in LOCAL_ADDRESSES


def check_port(port: int, host: str = HOST) -> None:
    """Raise :class:`ExplorerError` (one line) when ``port`` cannot be listened on."""
    if not 1 <= port <= 65535:
        raise ExplorerError(f"--port {port}: a port is 1-65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            why = "in use" if e.errno == errno.EADDRINUSE else (e.strerror or str(e))
            raise ExplorerError(f"port {port} on {host} is busy ({why}); pick another with --port") from None


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _healthy(port: int, host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/check_health", timeout=2) as r:
            return r.read().decode(errors="replace") == HEALTH_TEXT
    except OSError:
        return False


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy",
                                                                      "no_proxy")}
    env.update(HTTP_PROXY=NO_OUTSIDE, HTTPS_PROXY=NO_OUTSIDE, ALL_PROXY=NO_OUTSIDE, NO_PROXY="127.0.0.1,localhost",
               PYTHONUNBUFFERED="1")
    return env


def _stop(proc: subprocess.Popen, log, folder: Path | None) -> None:
    """Stop the child (and remove the folder it served, when it was a temporary one)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    with contextlib.suppress(Exception):
        log.close()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass
class ExplorerInstance:
    """A running Model Explorer serving ``folder``; stopped by :meth:`stop`, or when it is garbage-collected (a
    dashboard session ends) or the interpreter exits."""

    bundle: Bundle
    folder: Path
    port: int
    proc: subprocess.Popen
    host: str = HOST
    _finalizer: weakref.finalize = field(init=False, repr=False)

    @property
    def url(self) -> str:
        return self.bundle.url(self.folder, self.port, self.host)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        self._finalizer()

    def wait(self) -> int:
        return self.proc.wait()


def start_explorer(bundle: Bundle, folder: Path | None = None, port: int | None = None,
                   host: str = HOST) -> ExplorerInstance:
    """Write ``bundle`` (into ``folder``, else a temporary folder removed when the instance stops) and serve it with
    Model Explorer on ``host:port`` (a free port when None); returns once it answers."""
    if not explorer_installed():
        raise ExplorerError(f"Model Explorer is not installed: {INSTALL_LINE}")
    if port is None:
        port = free_port(host)
    check_port(port, host)
    temporary = folder is None
    folder = Path(tempfile.mkdtemp(prefix="qfold-explore-")) if folder is None else folder
    try:
        bundle.write(folder)
    except BaseException:
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a pipe nobody reads stops a long-lived server
    cmd = [sys.executable, "-m", "analyzer.report.explorer.explorer_child", str(os.getpid()),
           *bundle.command(folder, port, host)[3:]]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_child_env(),
                            cwd=str(Path(__file__).resolve().parents[3]))
    instance = ExplorerInstance(bundle, folder, port, proc, host)
    instance._finalizer = weakref.finalize(instance, _stop, proc, log, folder if temporary else None)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not _healthy(port, host):
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            tail = " ".join(log.read().split()[-40:])
            instance.stop()
            what = f"exited with {proc.returncode}" if proc.returncode is not None else \
                f"did not answer within {READY_TIMEOUT_S} s"
            raise ExplorerError(f"Model Explorer {what}: {tail or 'no output'}")
        time.sleep(0.25)
    return instance
