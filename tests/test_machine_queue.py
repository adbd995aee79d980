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


def test_the_builds_page_lists_a_conversion_of_another_builds_folder(tiny_builds, machine_dir, tmp_path):
    from tests.test_app import open_page

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_machine_entry(_entry("exaone-4.0-1.2b-qfold-state-ctx4096-abc123", child.pid, str(tmp_path / "theirs")))
        at = open_page("app_pages/builds.py")
        queue = next(d.value for d in at.dataframe if "builds folder" in d.value.columns)
        row = queue[queue["build"] == "exaone-4.0-1.2b-qfold-state-ctx4096-abc123"]
        assert list(row["builds folder"]) == [str(tmp_path / "theirs")] and list(row["pid"]) == [str(child.pid)]
    finally:
        child.kill()
        child.wait()


@pytest.mark.conversion
def test_a_finished_build_shows_what_it_measured_beside_its_estimate(tmp_path):
    """A BuildJob of a 2-layer pair: its process tree's peak RSS and CPU time are measured while it converts, and
    the page's line sets them beside the estimate it showed before (``app_pages.jobs_state``)."""
    from analyzer.convert.jobs import BuildJob
    from analyzer.model.cost import estimate_builds
    from analyzer.model.sources import resolve_source
    from analyzer.model.spec import ANALYSIS_MODE, BuildSpec
    from app_pages.jobs_state import measured_beside_estimate
    from tests.conftest import TINY_CTX, TINY_OVERRIDES

    source = resolve_source("exaone-4.0-1.2b", TINY_OVERRIDES)
    specs = tuple(BuildSpec(source, v, "state", TINY_CTX, build_mode=ANALYSIS_MODE) for v in ("repeat_kv", "qfold"))
    job = BuildJob(specs, tmp_path / "builds", estimate=estimate_builds(specs)).start()
    job._thread.join(timeout=300)
    snap = job.snapshot()
    assert snap.state == "done", snap.error
    assert 100e6 < snap.peak_rss_tree_bytes < 4e9 and snap.cpu_s > 1.0
    line = measured_beside_estimate(snap)
    assert line.startswith("peak ") and "measured (estimated" in line and "% off" in line
