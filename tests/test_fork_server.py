"""The fork server (analyzer.convert.fork_server) on real conversion children: forked from one server that imported
them, each in its own session, its output on the requester's pipe, its exit status relayed; an import-time variable
gets a server of its own, qfold's own variables do not; a dead server is replaced. The conversions themselves, kill -9
at every stage and two identical builds at once go through it in tests/test_builds_folder.py."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from analyzer.convert import fork_server
from analyzer.convert.fork_server import ForkedChild, start_child
from analyzer.convert.launch import REPO_ROOT, child_env
from analyzer.model.sources import DEFAULT_PRESET, resolve_source
from analyzer.model.spec import BuildSpec
from tests.conftest import TINY_CTX, TINY_OVERRIDES
from tests.test_builds_folder import hold_lock

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the fork server is Linux's")


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
    env = child_env()
    first, holder = waiting_child(tmp_path, env)
    try:
        server = fork_server._SERVER
        assert server is not None and server.alive()
        second = start_child(child_cmd(tmp_path / "missing.json", tmp_path), {**env, "QFOLD_ANY": "1"}, REPO_ROOT)
        assert fork_server._SERVER is server  # qfold's own variables are read when used: the same server
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


def test_another_value_of_an_import_time_variable_gets_its_own_server(tmp_path):
    cmd = child_cmd(tmp_path / "missing.json", tmp_path)
    assert start_child(cmd, child_env(), REPO_ROOT).wait(timeout=60) == 1
    before = fork_server._SERVER
    threads = "3" if os.environ.get("OMP_NUM_THREADS") != "3" else "2"
    child = start_child(cmd, {**child_env(), "OMP_NUM_THREADS": threads}, REPO_ROOT)
    assert child.wait(timeout=60) == 1
    assert fork_server._SERVER is not before and fork_server._SERVER.env["OMP_NUM_THREADS"] == threads
    assert before.proc.wait(timeout=30) == 0  # the old one, told to close, exits


def test_a_dead_server_is_replaced_and_other_commands_are_not_forked(tmp_path):
    cmd = child_cmd(tmp_path / "missing.json", tmp_path)
    assert start_child(cmd, child_env(), REPO_ROOT).wait(timeout=60) == 1
    server = fork_server._SERVER
    server.proc.kill()
    server.proc.wait()
    child = start_child(cmd, child_env(), REPO_ROOT)
    assert isinstance(child, ForkedChild) and child.wait(timeout=60) == 1
    assert fork_server._SERVER is not server and fork_server._SERVER.alive()
    plain = start_child([sys.executable, "-c", "print('hi')"], child_env(), REPO_ROOT)
    assert not isinstance(plain, ForkedChild) and plain.wait(timeout=60) == 0 and plain.stdout.read() == "hi\n"
