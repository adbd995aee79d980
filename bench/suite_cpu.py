"""Where the test run's time goes: CPU seconds per test file, and the shortest wall time the CPU allows.

    .venv/bin/python bench/suite_cpu.py                 # runs the suite as `make test` does, then writes the result
    .venv/bin/python bench/suite_cpu.py -- tests/test_x.py   # the same on some files only
    QFOLD_SUITE_CPU_ROWS=rows.jsonl PYTEST_ADDOPTS="-p bench.suite_cpu" make test   # rows only, from make itself

Runs ``pytest -n auto --dist loadfile --no-loadscope-reorder`` (the README's test command, after its install) with
this module as a plugin: each test's wall time and the CPU its worker spent during it, its own and its waited-for
children's (conversion children, CLI runs; a Streamlit server or a Ray worker counts where it is stopped and
waited for). Per file: wall, CPU, the heaviest tests. Whole run: wall and CPU of pytest and every process it
waited for (``RUSAGE_CHILDREN``), and ``cpu_floor_wall_s`` = that CPU over the cores: no scheduling of the same
work can finish sooner on this machine.

Results: ``bench/results/suite_cpu.json`` (an earlier result moves to ``history``), with the machine.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "suite_cpu.json"
ROWS_ENV = "QFOLD_SUITE_CPU_ROWS"  # where each worker appends its tests' rows


def _cpu_s() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


# ------------------------------------------------------------------------------------------- the pytest plugin
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """One row per test, appended by whichever worker ran it."""
    out = os.environ.get(ROWS_ENV)
    own0, children0 = _cpu_s()
    t0 = time.monotonic()
    yield
    if out:
        own1, children1 = _cpu_s()
        row = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
               "end_unix_s": round(time.time(), 2), "wall_s": round(time.monotonic() - t0, 2),
               "cpu_own_s": round(own1 - own0, 2), "cpu_children_s": round(children1 - children0, 2)}
        with open(out, "a") as f:  # one short line per write: appends from two workers do not interleave
            f.write(json.dumps(row) + "\n")



# ------------------------------------------------------------------------------------------------- the bench
def summarise(rows: list[dict], heaviest: int = 3) -> list[dict]:
    files: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        files[r["test"].split("::")[0]].append(r)
    out = []
    for name, tests in files.items():
        cpu = [t["cpu_own_s"] + t["cpu_children_s"] for t in tests]
        top = sorted(zip(cpu, tests, strict=True), key=lambda x: -x[0])[:heaviest]
        out.append({"file": name, "tests": len(tests), "wall_s": round(sum(t["wall_s"] for t in tests), 1),
                    "cpu_s": round(sum(cpu), 1), "cpu_own_s": round(sum(t["cpu_own_s"] for t in tests), 1),
                    "heaviest": [{"test": t["test"].split("::", 1)[1], "cpu_s": round(c, 1)} for c, t in top]})
    return sorted(out, key=lambda f: -f["cpu_s"])


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT / "bench"))
    from fast import machine  # bench/fast.py: the machine record of every bench result

    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    with tempfile.TemporaryDirectory() as tmp:
        rows_path = Path(tmp) / "rows.jsonl"
        # the plugin is this module, imported as bench.suite_cpu from the checkout (pytest runs in it); never
        # bench/ itself on the path: bench/coreai.py would shadow the coreai package
        env = dict(os.environ, **{ROWS_ENV: str(rows_path)})
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as make runs it
        cmd = [sys.executable, "-m", "pytest", "-n", "auto", "--dist", "loadfile", "--no-loadscope-reorder",
               "-p", "bench.suite_cpu", "-q", *extra]
        t0 = time.monotonic()
        code = subprocess.call(cmd, cwd=ROOT, env=env)
        wall = time.monotonic() - t0
        rows = [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.is_file() else []
    cpu = sum(_cpu_s()[1:])  # everything pytest and its descendants used (each waited for by its parent)
    cores = os.cpu_count() or 1
    ends: dict[str, float] = {}
    for r in rows:
        ends[r["worker"]] = max(ends.get(r["worker"], 0.0), r["end_unix_s"])
    result = {"command": " ".join(cmd[1:]), "exit_code": code, "tests": len(rows), "wall_s": round(wall, 1),
              "cpu_s": round(cpu, 1), "cores": cores, "cpu_floor_wall_s": round(cpu / cores, 1),
              "busy_cores": round(cpu / wall, 2) if wall else None,
              # how long each worker sat idle at the end while another still ran tests
              "worker_idle_at_end_s": {w: round(max(ends.values()) - e, 1) for w, e in sorted(ends.items())},
              "files": summarise(rows), "machine": machine()}
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    if "latest" in data:
        data.setdefault("history", []).append(data["latest"])
    data["latest"] = result
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp_results = RESULTS.with_suffix(".tmp")
    tmp_results.write_text(json.dumps(data, indent=1) + "\n")
    tmp_results.replace(RESULTS)
    print(f"wall {wall:.0f} s, CPU {cpu:.0f} s on {cores} cores (floor {cpu / cores:.0f} s), {len(rows)} tests; "
          f"{RESULTS.relative_to(ROOT)}")
    for f in result["files"][:15]:
        print(f"{f['cpu_s']:8.1f} s CPU {f['wall_s']:8.1f} s wall  {f['file']} ({f['tests']})")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
