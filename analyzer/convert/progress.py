"""Progress of the conversion child: ``@@qfold {json}`` lines on stdout for the parent, the same lines kept for
the build's ``build.log``, per-step timings and the process's peak memory. One module, imported under its own
name by ``analyzer.convert.child`` (which runs as ``__main__``) and by the build modes, so both write one log."""

from __future__ import annotations

import json
import resource
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from analyzer.errors import QfoldError

PROGRESS_PREFIX = "@@qfold "  # child → parent protocol: one JSON object per line after this prefix
T0 = time.monotonic()
LOG: list[str] = []


def restart_clock() -> None:
    """Start the clock and the log afresh: a child forked from a process that imported this module long before
    (``analyzer.convert.fork_server``) times its steps from its own start, as a new process would."""
    global T0
    T0 = time.monotonic()
    LOG.clear()


def emit(fraction: float, stage: str, message: str) -> None:
    line = f"[{time.monotonic() - T0:7.1f} s] {stage}: {message}"
    LOG.append(line)
    print(PROGRESS_PREFIX + json.dumps({"fraction": round(fraction, 3), "stage": stage, "message": message}),
          flush=True)


def result(key: str, outcome: str) -> None:
    """Tell the parent what this request did for ``key``: ``built``, or ``reused`` (an identical request elsewhere
    finished it while this one waited for the key lock)."""
    print(PROGRESS_PREFIX + json.dumps({"result": outcome, "key": key}), flush=True)


def report_errors(run: Callable[[], int]) -> int:
    """A child's exit code: ``run()``'s, or 1 with the error as the parent's last line (``{"error": ...}``): a
    QfoldError's own message, any other exception's type and message (its traceback goes to the log)."""
    try:
        return run()
    except QfoldError as e:
        print(PROGRESS_PREFIX + json.dumps({"error": str(e)}), flush=True)
        return 1
    except Exception as e:  # the parent shows this line; the traceback goes to the log
        traceback.print_exc()
        print(PROGRESS_PREFIX + json.dumps({"error": f"{type(e).__name__}: {e}"[:500]}), flush=True)
        return 1


def peak_rss_bytes(platform: str = sys.platform) -> int:
    """Peak resident memory of this process so far, in bytes. getrusage(2) gives ``ru_maxrss`` in kilobytes on
    Linux (Linux man-pages, getrusage(2)) and in bytes on macOS (Darwin's getrusage(2) man page)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if platform == "darwin" else 1024)


def worker_pool(max_workers: int, platform: str = sys.platform) -> ProcessPoolExecutor:
    """Worker processes beside the child (the equivalence check, an A/B's other variants). On Linux they fork from
    the child, which has already imported torch, transformers and coremltools: a ``spawn`` worker imported them
    again, ~10 s of CPU each. A worker sets its own torch thread count before it computes, as PyTorch's
    DataLoader workers do after a fork. On macOS they spawn (Apple's frameworks are not fork-safe)."""
    method = "fork" if platform.startswith("linux") else "spawn"
    return ProcessPoolExecutor(max_workers=max_workers, mp_context=get_context(method))


class SharedWorkers:
    """The worker processes of one conversion child (the equivalence check, an A/B's other variants), made as ONE
    pool of ``size`` processes, forked together at the first ``submit``, before the pool starts its manager thread
    (``ProcessPoolExecutor`` with ``fork`` launches every process then, and none later). Two pools forked the second
    while the first's manager thread ran: a fork with a thread alive, which may copy a lock that thread holds."""

    def __init__(self, size: int):
        self.size = size
        self._pool: ProcessPoolExecutor | None = None

    def plan(self, n: int) -> None:
        """``n`` more processes, before the pool is forked."""
        if self._pool is not None:
            raise RuntimeError("the worker processes are forked already; plan them all before the first job")
        self.size += n

    def submit(self, fn, *args):
        if self._pool is None:
            if self.size < 1:
                raise RuntimeError("no worker process was planned for this child")
            self._pool = worker_pool(self.size)
        return self._pool.submit(fn, *args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


class Clock:
    """Seconds per named step, rounded to ms (a name timed twice adds up)."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    def __call__(self, name: str, fn, *args, **kwargs):
        t = time.monotonic()
        result = fn(*args, **kwargs)
        self.timings[name] = round(self.timings.get(name, 0.0) + time.monotonic() - t, 3)
        return result
