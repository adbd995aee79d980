"""A Core AI child process: a qfold module that calls native Core AI code (the MLIR bindings, the runtime), run in a
process of its own with a time limit scaled to its work, its crash, error or timeout reported in one line.

Every Core AI child that reads or rewrites an asset goes through :func:`run_module`: the MLIR dump the walker reads
(:mod:`analyzer.ir.coreai.mlir_dump`), the op ids a bench joins (:mod:`analyzer.ir.coreai.op_ids`) and the fold's
rewrite (:mod:`analyzer.fold.coreai.rewrite`). Their work grows with the asset's program and weights: reading a
full-size EXAONE 4.0 1.2B asset (2.56 GB) took 6.7 s (bench/results/coreai.json, ``walk_s``), ~2.6 s per GB; the
limit is :data:`FIXED_S` (starting Python and importing the bindings on a busy machine) + :data:`FACTOR` x that.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

SECONDS_PER_GB = 2.6  # 6.7 s for the 2.56 GB full-size asset's walk (bench/results/coreai.json, walk_s)
FACTOR = 20.0  # a machine shared by many (load 17 here slowed work ~8x)
FIXED_S = 120.0
REPO_ROOT = str(Path(__file__).resolve().parents[3])


def asset_bytes(asset: str | Path) -> int:
    """The bytes of an asset's files (its program and weights)."""
    return sum(f.stat().st_size for f in Path(asset).rglob("*") if f.is_file())


def child_limit(work_bytes: int, seconds_per_gb: float = SECONDS_PER_GB) -> tuple[float, str]:
    """(seconds, how they were set) for a child whose work is ``work_bytes`` at ``seconds_per_gb``."""
    work = seconds_per_gb * work_bytes / 1e9
    return (FIXED_S + FACTOR * work,
            f"{FIXED_S:.0f} s + {FACTOR:.0f} x the estimated {work:.1f} s for {work_bytes / 1e9:.2f} GB")


def run_module(module: str, args: list[str], what: str, where: str, limit: tuple[float, str],
               error: type[Exception], check: bool = True) -> subprocess.CompletedProcess:
    """``python -m module args`` in a child (qfold's checkout first on its path), within ``limit`` (seconds, how
    they were set). A timeout raises ``error`` in one line (``<where>: <what> timed out after N s (its limit, …);
    stopped``); so does, with ``check``, a crash (a signal) or a non-zero exit (``crashed (SIGSEGV)``, ``failed
    (exit 1)``, with the child's last line of output)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (REPO_ROOT, os.environ.get("PYTHONPATH")) if p)}
    seconds, why = limit
    try:
        proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=env,
                              timeout=seconds)
    except subprocess.TimeoutExpired:
        raise error(f"{where}: {what} timed out after {seconds:.0f} s (its limit, {why}); stopped") from None
    if check and proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        raise error(f"{where}: {what} {exit_text(proc.returncode)}" + (f": {lines[-1][:300]}" if lines else ""))
    return proc


def exit_text(code: int) -> str:
    """``crashed (SIGSEGV)`` for a signal, ``failed (exit N)`` otherwise."""
    if code < 0:
        try:
            return f"crashed ({signal.Signals(-code).name})"
        except ValueError:
            return f"crashed (signal {-code})"
    return f"failed (exit {code})"
