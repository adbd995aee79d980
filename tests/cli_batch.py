"""Run many ``python -m analyzer`` invocations in a few long-lived child processes (importing torch, coremltools
and transformers once costs 3-20 s; a corpus of bad inputs would pay it per case). Each case goes through
``analyzer.cli.main`` exactly as the command line does, under its own limits:

* time: ``timeout_s`` of wall clock (SIGALRM; the regex engine, blocking opens and sleeps all return to Python
  for it), and the parent kills a child that does not answer within the limit plus a grace period, reports that
  case as ``killed`` and goes on with a fresh child;
* memory: the address space may grow by at most ``memory_bytes`` during the case (RLIMIT_AS, so an allocation
  past it fails in the case, not in the machine), and the case's own peak RSS is reported (``/proc/self/status``
  VmHWM, reset before each case through ``/proc/self/clear_refs``).

A case is ``{"argv": [...], "env": {...}, "timeout_s": optional, "without": [module, ...] optional}``
(``without``: modules this Python lacks for the case, as ``sys.modules[name] = None`` says to the import system: a
Python without grpcio, say); its result ``{"code", "stdout", "stderr",
"traceback", "seconds", "peak_rss_delta_bytes", "killed"}`` (``traceback``: what a user would have seen, else None).

``python tests/cli_batch.py`` reads a JSON list of cases on stdin and writes the JSON list of results (one child,
the old protocol); ``run_batch(cases)`` is the parent side for tests.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import resource
import signal
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_BYTES = 1 << 30
READY = "@@ready"
# what the cases' commands import lazily (torch comes with coremltools): paid once per child, before any limit
PRELOAD = ("coremltools", "transformers", "analyzer.fold.cache", "analyzer.engines.interpret")


_ABSENT = object()


class CaseTimeout(BaseException):  # not an Exception: a case's `except Exception` must not eat it
    """Raised by SIGALRM when a case runs past its time limit."""


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _on_alarm(signum, frame):
    raise CaseTimeout()


def run_case(argv: list[str], env: dict[str, str], timeout_s: float = DEFAULT_TIMEOUT_S,
             memory_bytes: int = DEFAULT_MEMORY_BYTES, without: tuple[str, ...] = ()) -> dict:
    from analyzer.cli import main

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    missing = {name: sys.modules.get(name, _ABSENT) for name in without}
    sys.modules.update(dict.fromkeys(without))  # None: "not installed" to find_spec and import alike
    out, err = io.StringIO(), io.StringIO()
    tb, killed = None, None
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    rss0 = _status_kib("VmRSS") * 1024
    t0 = time.monotonic()
    try:
        limit = _status_kib("VmSize") * 1024 + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, timeout_s)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:  # argparse
                code = e.code if isinstance(e.code, int) else 1
    except CaseTimeout:
        code, killed = -1, f"timeout after {timeout_s:g} s"
    except BaseException:  # what a user would see as a traceback
        code, tb = -1, traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        for name, module in missing.items():
            if module is _ABSENT:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    seconds = time.monotonic() - t0
    peak = _status_kib("VmHWM") * 1024 - rss0
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "traceback": tb, "killed": killed,
            "seconds": round(seconds, 3), "peak_rss_delta_bytes": peak}


def _serve(timeout_s: float, memory_bytes: int) -> None:
    """Child side: import once, then one JSON case per stdin line → one JSON result per stdout line."""
    import analyzer.cli

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    analyzer.cli.make_parser()  # every subcommand's module (placement's pulls pandas): paid here, not by a case

    real_stdout = sys.stdout
    print(READY, file=real_stdout, flush=True)
    for line in sys.stdin:
        if line.strip():
            case = json.loads(line)
            result = run_case(case["argv"], case.get("env", {}), case.get("timeout_s", timeout_s), memory_bytes,
                              tuple(case.get("without", ())))
            print(json.dumps(result), file=real_stdout, flush=True)


def _start(timeout_s: float, memory_bytes: int) -> tuple[subprocess.Popen, queue.Queue]:
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve", str(timeout_s),
                             str(memory_bytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, cwd=HERE.parent,
                            env={**os.environ, "PYTHONPATH": str(HERE.parent)})
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return proc, lines


def _run_chunk(cases: list[dict], timeout_s: float, memory_bytes: int, grace_s: float) -> list[dict]:
    results: list[dict] = []
    while len(results) < len(cases):
        proc, lines = _start(timeout_s, memory_bytes)
        try:
            if lines.get(timeout=600) != READY + "\n":
                raise RuntimeError("the cli_batch child did not start")
            for case in cases[len(results):]:
                proc.stdin.write(json.dumps(case) + "\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
                try:
                    line = lines.get(timeout=case.get("timeout_s", timeout_s) + grace_s)
                except queue.Empty:
                    line = None
                if line is None:  # hung past its own alarm, or the child died (a native crash)
                    why = "no answer" if proc.poll() is None else f"the child died (exit {proc.returncode})"
                    results.append({"code": None, "stdout": "", "stderr": "", "traceback": None, "seconds": None,
                                    "peak_rss_delta_bytes": None, "killed": f"{why} within {timeout_s + grace_s:g} s"})
                    break
                results.append(json.loads(line))
        finally:
            proc.kill()
            proc.wait()
    return results


def run_batch(cases: list[dict], workers: int = 2, timeout_s: float = DEFAULT_TIMEOUT_S,
              memory_bytes: int = DEFAULT_MEMORY_BYTES, grace_s: float = 20.0) -> list[dict]:
    """Results of ``cases`` in order, run by ``workers`` children side by side (contiguous chunks)."""
    size = max(1, -(-len(cases) // max(1, workers)))
    chunks = [cases[i:i + size] for i in range(0, len(cases), size)]
    out: list[list[dict]] = [[] for _ in chunks]
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, _run_chunk(chunks[i], timeout_s, memory_bytes,
                                                                                   grace_s)))
               for i in range(len(chunks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [r for chunk in out for r in chunk]


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        _serve(float(sys.argv[2]), int(sys.argv[3]))
    else:
        batch = json.load(sys.stdin)
        json.dump([run_case(c["argv"], c.get("env", {}), timeout_s=600, memory_bytes=16 << 30) for c in batch],
                  sys.stdout)
