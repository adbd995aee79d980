"""The machine-wide queue (issue 44): every conversion on the machine is listed, whichever builds folder it converts
into, while its process lives; and what a conversion measured (its process tree's peak RSS) is read from it."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from analyzer.convert.builds_folder import (
    MACHINE_QUEUE_ENV,
    QueueEntry,
    machine_queue,
    remove_machine_entry,
    write_machine_entry,
)
from analyzer.convert.jobs import TreeWatch


@pytest.fixture
def machine_dir(tmp_path, monkeypatch):
    folder = tmp_path / "machine-queue"
    monkeypatch.setenv(MACHINE_QUEUE_ENV, str(folder))
    return folder


def _entry(key: str, pid: int, root: str) -> QueueEntry:
    return QueueEntry(key, pid, "running", time.time(), root, psutil.Process(pid).create_time())


def test_a_conversion_in_another_builds_folder_is_listed_until_its_process_ends(machine_dir, tmp_path):
    burn = ("import time\nx = bytearray(50_000_000)\nt = time.process_time()\n"
            "while time.process_time() - t < 1.0: pass\ntime.sleep(30)")
    child = subprocess.Popen([sys.executable, "-c", burn])
    try:
        write_machine_entry(_entry("m-qfold-state-ctx256-abc", child.pid, str(tmp_path / "elsewhere")))
        listed = machine_queue()
        assert [(e.key, e.pid, e.root) for e in listed] == [("m-qfold-state-ctx256-abc", child.pid,
                                                              str(tmp_path / "elsewhere"))]
        watch = TreeWatch(("m-qfold-state-ctx256-abc",), tmp_path / "elsewhere")
        deadline = time.monotonic() + 10
        while watch.sample() < 50_000_000 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert watch.sample() >= 50_000_000  # the child's 50 MB bytearray is resident: measured, not estimated
        deadline = time.monotonic() + 30
        while watch.cpu_s < 1.0 and time.monotonic() < deadline:
            time.sleep(0.2)
            watch.sample()
        assert 1.0 <= watch.cpu_s < 5.0  # the second of CPU it burned
        assert TreeWatch(("m-qfold-state-ctx256-abc",), tmp_path / "another").sample() == 0  # by folder too
    finally:
        child.kill()
        child.wait()
    assert machine_queue() == []  # its process ended: the entry is gone
    assert list(machine_dir.glob("*.json")) == []


def test_a_reused_pid_is_not_the_conversion(machine_dir, tmp_path):
    me = psutil.Process()
    write_machine_entry(QueueEntry("k-1", me.pid, "queued", time.time(), str(tmp_path), me.create_time() - 100))
    assert machine_queue() == []  # same pid, another start time: another process
    write_machine_entry(_entry("k-2", me.pid, str(tmp_path)))
    assert [e.key for e in machine_queue()] == ["k-2"]
    remove_machine_entry("k-2")
    assert machine_queue() == []


def test_unreadable_entries_are_dropped_and_never_raise(machine_dir):
    machine_dir.mkdir()
    (machine_dir / "1-x.json").write_text("{not json")
    (machine_dir / "2-y.json").write_text('{"key": "../../etc", "pid": 1, "state": "running", "since": 0}')
    assert machine_queue() == []
