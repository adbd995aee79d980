"""The fork server can be trusted (issue 43): a requester talks only to its own user's server for that very name (a
squatted name is refused, nothing sent); the pid it kills is checked against the child's start time; a forked child
runs under its requester's limits (a lower ``ulimit -v`` gets a server of its own; a soft ``ulimit -t``, a umask and
a CPU affinity hold in a child of another process's server); a server for other code is never asked (an edited
module is what the next build runs); a server that does not start says why, in one line, within its timeout.

Real servers and real conversion children throughout: the requesters are other processes (``REQUESTER``) started
under the limits, as a shell would start them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from analyzer.convert import fork_address, fork_client
from analyzer.convert.fork_client import ForkedChild, start_child
from analyzer.convert.launch import REPO_ROOT, child_env
from analyzer.model.sources import DEFAULT_PRESET, resolve_source
from analyzer.model.spec import BuildSpec
from tests.conftest import TINY_CTX, TINY_OVERRIDES
from tests.test_builds_folder import hold_lock

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux's")

_OWN = f"{os.getpid()}-{os.urandom(4).hex()}"
# A requester as a shell command would start it (only the fork server's client imported: it runs under the limits
# too); prints the child's pid, then how the child ended and what it printed.
REQUESTER = textwrap.dedent("""
    import json, os, sys
    from analyzer.convert import fork_client
    cmd, env, cwd, setup = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    if "umask" in setup:
        os.umask(setup["umask"])
    if "nice" in setup:
        os.nice(setup["nice"])
    if "affinity" in setup:
        os.sched_setaffinity(0, setup["affinity"])
    child = fork_client.start_child(cmd, env, cwd)
    print(json.dumps({"pid": child.pid, "forked": isinstance(child, fork_client.ForkedChild)}), flush=True)
    out = child.stdout.read()
    print(json.dumps({"exit": child.wait(), "out": out}), flush=True)
""")


def own_env() -> dict[str, str]:
    """The launcher's environment with an import-time variable of this module's own: a server no other test
    module asks."""
    return {**child_env(), "FORK_TRUST_TEST": _OWN}


def child_cmd(request: Path, root: Path) -> list[str]:
    return [sys.executable, "-m", "analyzer.convert.child", str(request), str(root)]


def build_request(root: Path, seed: int) -> tuple[Path, str]:
    """A materialised tiny build of its own (``seed``) into ``root``: (request file, key)."""
    spec = BuildSpec(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES, seed=seed), "qfold", "state", TINY_CTX)
    request = root / f"request-{seed}.json"
    request.write_text(json.dumps(spec.to_json()))
    return request, spec.key


def our_server(tmp_path: Path) -> psutil.Process:
    """This process's server for :func:`own_env`, running (a child of it has run)."""
    assert start_child(child_cmd(tmp_path / "missing.json", tmp_path), own_env(), REPO_ROOT).wait(timeout=120) == 1
    assert fork_client._SERVER is not None and fork_client._SERVER.proc is not None
    return psutil.Process(fork_client._SERVER.proc.pid)


def requester(shell: str, cmd: list[str], env: dict[str, str], setup: dict | None = None) -> subprocess.Popen:
    """``shell`` (e.g. ``ulimit -v N``) then :data:`REQUESTER` for ``cmd``, as a shell would start it."""
    args = " ".join(f"'{a}'" for a in [json.dumps(cmd), json.dumps(env), str(REPO_ROOT), json.dumps(setup or {})])
    script = f"{shell} && exec '{sys.executable}' -c \"$REQUESTER\" {args}"
    return subprocess.Popen(["bash", "-c", script], env={**env, "REQUESTER": REQUESTER}, cwd=REPO_ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def limits_of(pid: int) -> dict[str, list[str]]:
    """``/proc/PID/limits``: limit name → [soft, hard] as the kernel prints them."""
    rows = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    return {row[:26].strip(): row[26:].split()[:2] for row in rows}


def eventually(check, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# ------------------------------------------------------------------------------------------------ identity
SQUATTER = textwrap.dedent("""
    import os, socket, sys
    if len(sys.argv) > 2:
        os.setuid(int(sys.argv[2]))
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(bytes.fromhex(sys.argv[1]))
    s.listen(4)
    print("listening", flush=True)
    conn, _ = s.accept()
    conn.settimeout(30)
    print(repr(conn.recv(1 << 20)), flush=True)
""")


@pytest.mark.parametrize("who", ["this user", "another user"])
def test_a_squatted_server_name_is_refused_and_nothing_is_sent(capfd, who):
    """Another process listening first at the name a requester computes: the requester connects, checks who
    listens, closes without sending a byte and says so in one line (``start_child`` then starts a server of its
    own, which cannot take the name: it serves that requester only)."""
    if who == "another user" and os.getuid() != 0:
        pytest.skip("needs root to listen as another user")
    env = {**own_env(), "SQUATTED": who}
    address = fork_address.server_address(env)
    squatter = subprocess.Popen([sys.executable, "-c", SQUATTER, address.hex(), *(["65534"] if who != "this user"
                                                                                 else [])],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline() == "listening\n"
        capfd.readouterr()
        assert fork_client._connect(env, address, fork_address.bounds()) is None  # what start_child asks first
        said = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("qfold: ")]
        assert squatter.stdout.readline() == "b''\n"  # connected, checked, closed: not a byte of a request
        assert len(said) == 1 and f"is held by pid {squatter.pid}" in said[0], said
        assert said[0].endswith("not used; this process starts a fork server of its own")
        assert ("of uid 65534, not this user" in said[0]) == (who == "another user"), said[0]
        assert ("not qfold's fork server for it" in said[0]) == (who == "this user"), said[0]
    finally:
        squatter.kill()
        squatter.wait()


def test_a_pid_is_killed_only_while_it_names_the_forked_child(tmp_path):
    request, key = build_request(tmp_path, seed=431)
    holder = hold_lock(tmp_path, key)
    other = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        child = start_child(child_cmd(request, tmp_path), own_env(), REPO_ROOT)
        assert isinstance(child, ForkedChild)
        assert child.started == fork_address.start_time(child.pid) is not None  # as the server read it
        # what a reused number looks like: the pid of another process, with the child's start time
        stale = ForkedChild(other.pid, child.started, child.stdout, child._channel)
        assert not stale.is_ours()
        stale.kill()
        assert other.poll() is None  # not killed: the number names another process
        child.kill()
        assert child.wait(timeout=60) == -signal.SIGKILL
    finally:
        other.kill()
        other.wait()
        holder.kill()
        holder.wait()


# ------------------------------------------------------------------------------------------------ limits
def test_a_build_under_a_lower_ulimit_v_and_nice_runs_under_them_even_forked_by_another_process_server(tmp_path):
    env = own_env()
    ours = our_server(tmp_path)
    # room for the server's imports (the same code: the same ~0.9 GB), not for a build (a tiny one takes +50-130 MB)
    limit_kib = (ours.memory_info().vms >> 10) + (32 << 10)
    request, key = build_request(tmp_path, seed=432)
    holder = hold_lock(tmp_path, key)
    nice = os.getpriority(os.PRIO_PROCESS, 0) + 3
    proc = requester(f"ulimit -v {limit_kib}", child_cmd(request, tmp_path), env, {"nice": 3})
    try:
        started = json.loads(proc.stdout.readline() or proc.stderr.read())
        child = psutil.Process(started["pid"])
        assert child.ppid() == ours.pid  # lower limits, a higher nice value: a child of the running server can
        assert eventually(lambda: limits_of(child.pid)["Max address space"] == [str(limit_kib << 10)] * 2)
        assert eventually(lambda: child.nice() == nice)
        assert limits_of(ours.pid)["Max address space"] == ["unlimited"] * 2  # the server's own: unchanged
    finally:
        holder.kill()
        holder.wait()
    ended = json.loads(proc.stdout.readline() or proc.stderr.read())
    proc.wait(timeout=60)
    assert ended["exit"] == 1, ended["out"][-2000:]  # the build needs more than the limit: it fails under it
    assert "Cannot allocate memory" in ended["out"].splitlines()[-1], ended["out"][-2000:]


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to lower a nice value")
def test_a_requester_the_running_server_cannot_serve_starts_its_own(tmp_path):
    """A lower nice value than the server's (or a higher hard limit) is beyond what a forked child can take on: the
    requester starts a server of its own, and its child runs at its nice value."""
    env = own_env()
    ours = our_server(tmp_path)
    request, key = build_request(tmp_path, seed=435)
    holder = hold_lock(tmp_path, key)
    proc = requester("true", child_cmd(request, tmp_path), env, {"nice": -2})
    try:
        started = json.loads(proc.stdout.readline() or proc.stderr.read())
        child = psutil.Process(started["pid"])
        assert started["forked"] and child.ppid() != ours.pid
        assert child.nice() == os.getpriority(os.PRIO_PROCESS, 0) - 2
    finally:
        proc.kill()
        proc.wait()
        holder.kill()
        holder.wait()
        psutil.Process(started["pid"]).kill()


def test_a_soft_ulimit_t_umask_and_affinity_hold_in_a_child_of_another_process_server(tmp_path):
    env = own_env()
    ours = our_server(tmp_path)
    request, key = build_request(tmp_path, seed=433)
    holder = hold_lock(tmp_path, key)
    setup = {"umask": 0o077, "affinity": [min(os.sched_getaffinity(0))]}
    proc = requester("ulimit -S -t 1", child_cmd(request, tmp_path), env, setup)
    try:
        started = json.loads(proc.stdout.readline() or proc.stderr.read())
        child = psutil.Process(started["pid"])
        assert started["forked"] and child.ppid() == ours.pid  # the running server, shared: same hard limits
        # taken on in the child right after the fork (it then waits for the key lock)
        assert eventually(lambda: limits_of(child.pid)["Max cpu time"][0] == "1")
        assert limits_of(ours.pid)["Max cpu time"][0] == "unlimited"  # the server's own: unchanged
        assert eventually(lambda: child.cpu_affinity() == setup["affinity"])
        assert eventually(lambda: "Umask:\t0077" in Path(f"/proc/{child.pid}/status").read_text())
    finally:
        holder.kill()
        holder.wait()
    ended = json.loads(proc.stdout.readline() or proc.stderr.read())
    proc.wait(timeout=60)
    assert ended["exit"] == -signal.SIGXCPU, ended  # a materialised build needs more than 1 s of CPU


def test_the_address_holds_what_a_child_cannot_take_on_and_not_what_it_can():
    env = child_env()
    here = fork_address.server_address(env)
    code = ("import json, resource, sys\nfrom analyzer.convert import fork_address\n"
            "resource.setrlimit(resource.RLIMIT_CPU, (600, 900))\n"  # soft and hard: a child takes both on
            "limits = fork_address.own_limits()\n"
            "print(json.dumps([fork_address.server_address(json.loads(sys.argv[1])).hex(),"
            " limits['soft']['RLIMIT_CPU'], limits['hard']['RLIMIT_CPU']]))\n")
    run = subprocess.run([sys.executable, "-c", code, json.dumps(env)], env=env, cwd=REPO_ROOT, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == [here.hex(), 600, 900]
    server = {"hard": {"RLIMIT_AS": 1 << 30, "RLIMIT_CPU": -1}, "nice": 5, "oom_score_adj": 0}
    assert fork_address.cannot_serve(server, {**server, "hard": {"RLIMIT_AS": 1 << 29, "RLIMIT_CPU": 60},
                                              "nice": 19, "oom_score_adj": 1000}) is None  # a Ray worker's
    assert fork_address.cannot_serve(server, {**server, "hard": {"RLIMIT_AS": -1, "RLIMIT_CPU": -1}}) == \
        f"its hard RLIMIT_AS is {1 << 30}, below this process's -1"
    assert fork_address.cannot_serve(server, {**server, "nice": 0}) == "its nice is 5, above this process's 0"
    assert "oom_score_adj" in fork_address.cannot_serve({**server, "oom_score_adj": 1000}, server)
    versions = fork_address.library_versions()
    assert versions["coremltools"] and versions["torch"] and versions["transformers"]


def test_another_library_version_is_another_server(monkeypatch):
    env = child_env()
    here = fork_address.server_address(env)
    versions = fork_address.library_versions()
    monkeypatch.setattr(fork_address, "library_versions", lambda: {**versions, "coremltools": "9.1"})
    assert fork_address.server_address(env) != here


# ------------------------------------------------------------------------------------------------ freshness
EDITING_REQUESTER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from analyzer.convert import fork_client
    cmd, env, cwd, child_py = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    def run():
        child = fork_client.start_child(cmd, env, cwd)
        out = child.stdout.read()
        return {"exit": child.wait(), "out": out, "server": fork_client._SERVER.proc.pid,
                "forked": isinstance(child, fork_client.ForkedChild)}
    first, again = run(), run()
    text = child_py.read_text()
    edit = "    quiet_coremltools()\\n    print('edit 43 ran')\\n"
    child_py.write_text(text.replace("    quiet_coremltools()\\n", edit, 1))
    print(json.dumps([first, again, run()]))
""")


def test_an_edited_module_is_what_the_next_build_runs(tmp_path):
    """A copy of qfold (its own checkout), one requesting process: a build, the same again (one server), an edit
    of the child's module, a build: it runs the edited code, from another server."""
    copy = tmp_path / "qfold"
    shutil.copytree(REPO_ROOT / "analyzer", copy / "analyzer", ignore=shutil.ignore_patterns("__pycache__", "shipped"))
    env = {**own_env(), "PYTHONPATH": str(copy)}
    cmd = child_cmd(tmp_path / "missing.json", tmp_path)
    run = subprocess.run([sys.executable, "-c", EDITING_REQUESTER, json.dumps(cmd), json.dumps(env), str(copy),
                          str(copy / "analyzer" / "convert" / "child.py")],
                         env=env, cwd=copy, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    first, again, edited = json.loads(run.stdout)
    assert first["forked"] and again["forked"] and edited["forked"]
    assert again["server"] == first["server"]  # unchanged code: the running server
    assert "edit 43 ran" not in first["out"] and first["exit"] == 1 and "missing.json" in first["out"]
    assert edited["server"] != first["server"]  # the old server has the old code imported: never asked again
    assert edited["out"].startswith("edit 43 ran\n") and edited["exit"] == 1, edited


# ------------------------------------------------------------------------------------------------ start-up
def _fake_server(tmp_path: Path, body: str) -> tuple[dict[str, str], Path]:
    """(environment, working directory) where ``analyzer.convert.fork_server`` is ``body`` (a checkout of its own)."""
    root = tmp_path / "fake"
    (root / "analyzer" / "convert").mkdir(parents=True)
    (root / "analyzer" / "__init__.py").write_text("")
    (root / "analyzer" / "convert" / "__init__.py").write_text("")
    (root / "analyzer" / "convert" / "fork_server.py").write_text(body)
    return {**own_env(), "PYTHONPATH": str(root)}, root


def test_a_server_that_fails_to_start_says_why_in_one_line(tmp_path, capfd):
    env, cwd = _fake_server(tmp_path, "import sys\nprint('imports failed', file=sys.stderr)\nsys.exit(3)\n")
    capfd.readouterr()
    child = start_child([sys.executable, "-m", "analyzer.convert.child", "--help"], env, cwd)
    said = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("qfold: ")]
    assert not isinstance(child, ForkedChild)  # started as a new process instead
    child.kill()
    child.wait()
    assert said == ["qfold: the fork server did not start (it exited with code 3: imports failed); children start "
                    "as new processes"]


def test_a_server_that_hangs_at_start_up_is_given_up_after_its_timeout(tmp_path, capfd, monkeypatch):
    env, cwd = _fake_server(tmp_path, "import time\ntime.sleep(600)\n")
    monkeypatch.setattr(fork_client, "STARTUP_TIMEOUT_S", 2.0)
    capfd.readouterr()
    t = time.monotonic()
    child = start_child([sys.executable, "-m", "analyzer.convert.child", "--help"], env, cwd)
    waited = time.monotonic() - t
    said = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("qfold: ")]
    assert not isinstance(child, ForkedChild)
    child.kill()
    child.wait()
    assert 2.0 <= waited < 30
    assert said == ["qfold: the fork server did not start (no 'ready' within 2 s (its imports)); children start "
                    "as new processes"]
    assert fork_client._CLOSED and all(s.proc.poll() is not None for s in fork_client._CLOSED)  # killed, reaped


# ------------------------------------------------------------------------------------------------ forks
AT_FORK = textwrap.dedent("""
    import json, os, sys, threading
    log = open(sys.argv[3], "a")
    def before():
        log.write(json.dumps({"pid": os.getpid(), "threads": [t.name for t in threading.enumerate()]}) + "\\n")
        log.flush()
    os.register_at_fork(before=before)
    from analyzer.convert.child import main
    sys.exit(main(sys.argv[1:3]))
""")


def test_no_thread_is_alive_when_a_conversion_child_forks_its_workers(tmp_path):
    """One request of an analysis A/B of a model larger than the reduced one and a materialised build: the
    equivalence checks run in one worker process and the A/B's second variant in another, both forked from the
    child (which used to fork the second while the first's pool ran its manager thread). Every fork happens with the
    child's main thread alone."""
    source = resolve_source(DEFAULT_PRESET, (*TINY_OVERRIDES, "num_hidden_layers=3"), seed=434)
    specs = [*(BuildSpec(source, v, "state", TINY_CTX, build_mode="analysis") for v in ("repeat_kv", "qfold")),
             BuildSpec(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES, seed=434), "qfold", "state", TINY_CTX)]
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"specs": [s.to_json() for s in specs]}))
    forks = tmp_path / "forks.jsonl"
    run = subprocess.run([sys.executable, "-c", AT_FORK, str(request), str(tmp_path), str(forks)],
                         env=child_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:]
    assert "checking the variants' equivalence in a worker process" in run.stdout
    assert "converting qfold in 1 worker process(es) beside this one" in run.stdout
    records = [json.loads(line) for line in forks.read_text().splitlines()]
    assert records and all(r["threads"] == ["MainThread"] for r in records), records


def test_a_server_from_other_code_than_the_requester_s_is_given_up(tmp_path, capfd):
    """A requester that imported qfold before an edit starts a server from the code on disk: their protocols may
    differ, so the server says its own in its first line and the requester gives it up when it is not its own."""
    env, cwd = _fake_server(tmp_path, "import sys, time\nprint('ready 0123456789abcdef', flush=True)\n"
                                      "time.sleep(600)\n")
    capfd.readouterr()
    child = start_child([sys.executable, "-m", "analyzer.convert.child", "--help"], env, cwd)
    said = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("qfold: ")]
    assert not isinstance(child, ForkedChild)
    child.kill()
    child.wait()
    assert said == ["qfold: the fork server did not start (its code is not this process's (qfold's fork server "
                    "modules changed on disk since this process imported them)); children start as new processes"]
