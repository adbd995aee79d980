"""The fork server (analyzer.convert.fork_client) on real conversion children: forked from one server that imported
them, each in its own session, its output on the requester's pipe, its exit status relayed; an import-time variable
gets a server of its own, qfold's own variables do not; a dead server is replaced; another process with the same
environment forks from the running server, another user is refused. The conversions themselves, kill -9 at every
stage and two identical builds at once go through it in tests/test_builds_folder.py.

These tests ask for a server of their own (an import-time variable of their own, ``own_env``): the test run's
other servers are shared by both workers, and these tests kill or replace theirs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
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


def own_env() -> dict[str, str]:
    """The launcher's environment with an import-time variable no other process has: a server of this module's
    own (one for the tests that keep it, the last two replace it)."""
    return {**child_env(), "FORK_SERVER_TEST": _OWN}


def child_cmd(request: Path, root: Path) -> list[str]:
    return [sys.executable, "-m", "analyzer.convert.child", str(request), str(root)]


def waiting_child(tmp_path: Path, env: dict[str, str]) -> tuple[ForkedChild, object]:
    """A real conversion child that waits for its build's key lock, held by another process."""
    spec = BuildSpec(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES), "qfold", "state", TINY_CTX)
    request = tmp_path / "request.json"
    request.write_text(json.dumps(spec.to_json()))
    holder = hold_lock(tmp_path, spec.key)
    child = start_child(child_cmd(request, tmp_path), env, REPO_ROOT)
    assert isinstance(child, ForkedChild)
    return child, holder


def test_children_are_forked_by_one_server_in_their_own_sessions(tmp_path):
    env = own_env()
    first, holder = waiting_child(tmp_path, env)
    try:
        server = fork_client._SERVER
        assert server is not None and server.alive()
        second = start_child(child_cmd(tmp_path / "missing.json", tmp_path), {**env, "QFOLD_ANY": "1"}, REPO_ROOT)
        assert fork_client._SERVER is server  # qfold's own variables are read when used: the same server
        assert second.wait(timeout=60) == 1  # its exit status, relayed by the server
        out = second.stdout.read()
        assert out.startswith('@@qfold {"error"') and "missing.json" in out, out
        assert psutil.Process(first.pid).ppid() == server.proc.pid
        assert os.getsid(first.pid) == first.pid != os.getsid(0)  # a session (and process group) of its own
        assert first.poll() is None  # still waiting for the key lock
        first.kill()
        assert first.wait(timeout=60) == -signal.SIGKILL
    finally:
        first.kill()
        holder.kill()
        holder.wait()


def test_another_process_with_the_same_environment_forks_from_the_running_server(tmp_path, monkeypatch):
    env = own_env()
    first, holder = waiting_child(tmp_path, env)  # this process's own server, forking a child that waits
    try:
        server = fork_client._SERVER
        assert server.proc is not None
        # this process as another would start: no server of its own yet, the same environment
        monkeypatch.setattr(fork_client, "_SERVER", None)
        second = start_child(child_cmd(tmp_path / "missing.json", tmp_path), env, REPO_ROOT)
        shared = fork_client._SERVER
        assert isinstance(second, ForkedChild) and shared is not server and shared.proc is None  # a connection
        assert psutil.Process(second.pid).ppid() == server.proc.pid  # forked by the running server
        assert second.wait(timeout=60) == 1 and "missing.json" in second.stdout.read()  # its status relayed
        shared.close()
        monkeypatch.undo()
        # a real other process: the same environment, its own interpreter
        code = ("import json, sys\nfrom analyzer.convert import fork_client\n"
                "c = fork_client.start_child(json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3])\n"
                "print(json.dumps([type(c).__name__, fork_client._SERVER.proc is None, c.wait(timeout=60)]))\n")
        cmd = child_cmd(tmp_path / "missing.json", tmp_path)
        run = subprocess.run([sys.executable, "-c", code, json.dumps(cmd), json.dumps(env), str(REPO_ROOT)],
                             env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout) == ["ForkedChild", True, 1]  # no server started: its imports saved
    finally:
        first.kill()
        holder.kill()
        holder.wait()


def test_the_server_address_changes_with_the_code_and_the_import_time_environment(monkeypatch):
    env = child_env()
    here = fork_address.server_address(env)
    assert here.startswith(f"\0qfold-fork-server-{os.getuid()}-".encode())
    assert fork_address.server_address({**env, "QFOLD_BUILDS": "/elsewhere", "PYTEST_CURRENT_TEST": "x"}) == here
    assert fork_address.server_address({**env, "SHLVL": "7", "PWD": "/elsewhere", "_": "/usr/bin/env"}) == here
    ray = {"RAY_JOB_ID": "01000000", "RAY_RAYLET_PID": "12579", "PYTHONBREAKPOINT": "ray.util.rpdb.set_trace",
           "SPT_NOENV": "1"}  # what ray.init() sets in its driver and a Ray worker starts with
    assert fork_address.server_address({**env, **ray}) == here
    assert fork_address.server_address({**env, "OMP_NUM_THREADS": "7"}) != here
    digest = fork_address.code_digest()
    monkeypatch.setattr(fork_address, "code_digest", lambda: digest[::-1])  # an edit
    assert fork_address.server_address(env) != here
    # a caller started with the checkout on PYTHONPATH (a script, a Ray worker) gets the child environment of one
    # started without it: the checkout once, first
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO_ROOT), "/elsewhere"]))
    assert child_env()["PYTHONPATH"] == os.pathsep.join([str(REPO_ROOT), "/elsewhere"])
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert child_env()["PYTHONPATH"] == os.pathsep.join([str(REPO_ROOT), "/elsewhere"])


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to connect as another user")
def test_another_user_is_refused(tmp_path):
    env = own_env()
    assert start_child(child_cmd(tmp_path / "missing.json", tmp_path), env, REPO_ROOT).wait(timeout=60) == 1
    address = fork_address.server_address(env)
    code = ("import os, socket, sys\nos.setuid(65534)\n"
            "c = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\nc.connect(bytes.fromhex(sys.argv[1]))\n"
            "mine, its = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)\nr, w = os.pipe()\n"
            "try:\n    socket.send_fds(c, [sys.argv[2].encode()], [its.fileno(), w])\n"
            "except OSError:\n    print('closed')\nelse:\n    its.close()\n    print(repr(mine.recv(100)))\n")
    request = json.dumps({"module": "analyzer.convert.child", "args": ["/nonexistent"], "env": {}, "cwd": "/"})
    run = subprocess.run([sys.executable, "-c", code, address.hex(), request], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() in ("b''", "closed")  # connected, then closed without forking anything


def test_another_value_of_an_import_time_variable_gets_its_own_server(tmp_path):
    cmd = child_cmd(tmp_path / "missing.json", tmp_path)
    env = own_env()
    assert start_child(cmd, env, REPO_ROOT).wait(timeout=60) == 1
    before = fork_client._SERVER
    threads = "3" if os.environ.get("OMP_NUM_THREADS") != "3" else "2"
    child = start_child(cmd, {**env, "OMP_NUM_THREADS": threads}, REPO_ROOT)
    assert child.wait(timeout=60) == 1
    assert fork_client._SERVER is not before and fork_client._SERVER.env["OMP_NUM_THREADS"] == threads
    assert before.proc.wait(timeout=30) == 0  # the old one, told to close, exits


def test_a_dead_server_is_replaced_and_other_commands_are_not_forked(tmp_path):
    cmd = child_cmd(tmp_path / "missing.json", tmp_path)
    env = own_env()
    assert start_child(cmd, env, REPO_ROOT).wait(timeout=60) == 1
    server = fork_client._SERVER
    server.proc.kill()
    server.proc.wait()
    child = start_child(cmd, env, REPO_ROOT)
    assert isinstance(child, ForkedChild) and child.wait(timeout=60) == 1
    assert fork_client._SERVER is not server and fork_client._SERVER.alive()
    plain = start_child([sys.executable, "-c", "print('hi')"], env, REPO_ROOT)
    assert not isinstance(plain, ForkedChild) and plain.wait(timeout=60) == 0 and plain.stdout.read() == "hi\n"
