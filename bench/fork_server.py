"""What the fork server saves and costs (analyzer.convert.fork_client), measured in one run on this machine.

1. ``server_start``: a fork server from its start to ``ready`` (its imports): wall time, its CPU time, its RSS.
2. ``child``: the same conversion child (``python -m analyzer.convert.child`` of a request file that does not exist:
   it imports, then fails at once), ``--repeats`` times each way: started with ``subprocess.Popen`` (it pays the
   imports: wall and CPU) and forked by the running server (wall from the request to its exit status). The ratio
   is what one conversion child saves.
3. ``address``: ``fork_address.server_address`` per request (code digest, library versions, limits): median of 200.

usage: nice -n 10 python bench/fork_server.py  (writes bench/results/fork_server.json)
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _cpu_s(pid: int) -> float:
    """utime + stime of a live process (``/proc/PID/stat`` fields 14 and 15)."""
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    fields = stat[stat.rindex(b")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def main(repeats: int) -> dict:
    from analyzer.convert import fork_address, fork_client
    from analyzer.convert.launch import REPO_ROOT, child_env

    env = {**child_env(), "FORK_SERVER_BENCH": str(os.getpid())}  # a server of this run's own
    tmp = Path(tempfile.mkdtemp())
    cmd = [sys.executable, "-m", "analyzer.convert.child", str(tmp / "missing.json"), str(tmp)]

    t = time.monotonic()
    server = fork_client._Server(env, str(REPO_ROOT), fork_address.server_address(env))
    assert server.ready, server.why_not
    start = {"wall_s": round(time.monotonic() - t, 2), "cpu_s": round(_cpu_s(server.proc.pid), 2),
             "rss_bytes": _rss_bytes(server.proc.pid)}
    fork_client._SERVER = server

    popen_wall, popen_cpu, forked_wall = [], [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.monotonic()
        proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True)
        popen_wall.append(time.monotonic() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        popen_cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
        assert proc.returncode == 1
        t = time.monotonic()
        child = fork_client.start_child(cmd, env, REPO_ROOT)
        assert isinstance(child, fork_client.ForkedChild)
        child.stdout.read()
        assert child.wait() == 1
        forked_wall.append(time.monotonic() - t)

    address_s = []
    for _ in range(200):
        t = time.perf_counter()
        fork_address.server_address(env)
        address_s.append(time.perf_counter() - t)
    fork_client.stop_servers()

    med = statistics.median
    return {
        "machine": {"cpu_count": os.cpu_count(), "load_1min_at_start": os.getloadavg()[0]},
        "server_start": start,
        "child": {"repeats": repeats, "popen_wall_s": round(med(popen_wall), 2),
                  "popen_cpu_s": round(med(popen_cpu), 2), "forked_wall_s": round(med(forked_wall), 3),
                  "popen_over_forked_wall": round(med(popen_wall) / med(forked_wall), 1)},
        "address": {"median_ms": round(1000 * med(address_s), 2), "max_ms": round(1000 * max(address_s), 2)},
    }


if __name__ == "__main__":
    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 3
    result = main(repeats)
    out = ROOT / "bench" / "results" / "fork_server.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
