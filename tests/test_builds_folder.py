"""The builds folder shared by a team: stray names, dead queue entries, concurrent identical builds, silent
children and kill -9 at every stage (issue #11). Ownership is by lock, never by pid alone."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from analyzer.convert.builds_folder import QUEUE_DIR, clean_stale_tmp, key_lock, latest_log, lock_is_held, queue
from analyzer.convert.checks import is_reduced_size
from analyzer.convert.fork_client import start_child
from analyzer.convert.launch import (
    TIMEOUT_FACTOR,
    TIMEOUT_FIXED_S,
    child_env,
    list_builds,
    run_build,
    run_child,
    work_timeout,
)
from analyzer.errors import BuildError
from analyzer.model.sources import DEFAULT_PRESET, resolve_source
from analyzer.model.spec import BuildSpec

from .conftest import TINY_CTX, TINY_OVERRIDES

REPO = Path(__file__).resolve().parent.parent
HOLD = ("import sys, time; from filelock import FileLock; lock = FileLock(sys.argv[1]); lock.acquire(); "
        "print('held', flush=True); time.sleep(600)")


def hold_lock(root: Path, key: str) -> subprocess.Popen:
    """Another process (think: another container on the same volume) holding build ``key``'s lock."""
    key_lock(root, key)  # creates .locks/
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(root / ".locks" / f"{key}.lock")],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_stale_tmp_cleanup_never_raises_and_deletes_only_what_nobody_owns(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    root = tmp_path / "builds"
    root.mkdir()
    dead = root / ".tmp-exaone-qfold-state-ctx256-0123456789-4242"  # a killed build: its lock is free
    dead.mkdir()
    (dead / "analysis.json").write_text("{")
    foreign = [root / ".tmp-x", root / ".tmp-", root / ".tmp-key-999999999999999999999999999",
               root / ".tmp-key--1", root / ".tmp-..-1", root / ".tmp-.hidden-3", root / ".tmp-key-12ab"]
    for f in foreign:
        f.mkdir()
    (root / ".tmp-file-7").write_text("a file, not a build folder")
    (root / ".tmp-link-8").symlink_to(outside, target_is_directory=True)
    owned = root / ".tmp-live-key-0123456789-1"  # pid 1 is alive here, but the point is the lock
    owned.mkdir()
    holder = hold_lock(root, "live-key-0123456789")
    try:
        removed = clean_stale_tmp(root)
        assert removed == [dead]
        assert owned.is_dir()  # held by another process: never deleted, whatever its pid says
    finally:
        holder.kill()
        holder.wait()
    assert clean_stale_tmp(root) == [owned]  # its owner is gone: now it is a leftover
    assert (outside / "precious.txt").read_text() == "keep me"  # a symlink is never followed
    assert (root / ".tmp-file-7").is_file() and (root / ".tmp-link-8").is_symlink()
    assert all(f.is_dir() for f in foreign)


def test_a_queue_entry_without_a_live_owner_disappears(tmp_path):
    qdir = tmp_path / QUEUE_DIR
    qdir.mkdir()
    entries = {
        "negative-pid": {"key": "k-0123456789", "pid": -1, "state": "queued", "since": 1.0},
        "pid-zero": {"key": "k-0123456789", "pid": 0, "state": "queued", "since": 1.0},
        "alive-pid-no-lock": {"key": "k-0123456789", "pid": os.getpid(), "state": "running", "since": 1.0},
        "bad-key": {"key": "../../x", "pid": os.getpid(), "state": "running", "since": 1.0},
        "not-json": None,
        "held": {"key": "held-0123456789", "pid": 12345, "state": "running", "since": 2.0},
    }
    for name, doc in entries.items():
        (qdir / f"{name}.json").write_text("{" if doc is None else json.dumps(doc))
    holder = hold_lock(tmp_path, "held-0123456789")
    try:
        listed = queue(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    assert [e.key for e in listed] == ["held-0123456789"]  # pid 12345 need not exist here: another host's
    assert sorted(p.stem for p in qdir.glob("*.json")) == ["held"]  # the dead ones are gone, not just hidden
    assert queue(tmp_path) == [] and not list(qdir.glob("*.json"))  # its owner went away too


def test_a_silent_child_is_still_stopped_by_its_timeout(tmp_path):
    grandchild = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
                  "'import time; time.sleep(600)']); print(p.pid, flush=True); time.sleep(600)")
    log = tmp_path / "child.log"
    t0 = time.monotonic()
    with pytest.raises(BuildError, match="timed out after 2 s"):
        run_child("silent-0123456789", [sys.executable, "-c", grandchild], log, timeout_s=2)
    assert time.monotonic() - t0 < 30
    pid = int(log.read_text().split()[0])
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the child's own child survived the timeout"
        time.sleep(0.1)


def test_time_queued_is_not_work_and_the_timeout_line_says_the_limit_and_what_the_child_was_doing(tmp_path):
    """A child queued (another conversion running) for longer than its limit is not stopped; once it works, its
    limit holds, and the error line says the limit, how it was set and the stage it was in."""
    script = ("import json, time\n"
              "def say(stage, message):\n"
              "    print('@@qfold ' + json.dumps({'fraction': 0.0, 'stage': stage, 'message': message}), flush=True)\n"
              "for _ in range(8):\n"
              "    say('queued', 'waiting: another conversion is running on this machine')\n"
              "    time.sleep(0.5)\n"
              "say('convert', 'tracing and converting the decode step')\n"
              "time.sleep(600)\n")
    t0 = time.monotonic()
    with pytest.raises(BuildError) as e:
        run_child("queued-0123456789", [sys.executable, "-c", script], tmp_path / "child.log", timeout_s=2,
                  timeout_why="as the test sets it")
    assert time.monotonic() - t0 >= 4 + 2  # ~4 s queued, then 2 s of work
    assert str(e.value).startswith("build queued-0123456789 timed out after 2 s of work (its limit, as the test "
                                   "sets it) while convert: tracing and converting the decode step; log: ")


def test_a_childs_limit_is_scaled_to_its_builds():
    tiny = BuildSpec(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES), "qfold", "state", TINY_CTX)
    full = BuildSpec(resolve_source(DEFAULT_PRESET), "qfold", "state", 4096)
    (t_tiny, why), (t_full, _), (t_two, _) = (work_timeout([tiny]), work_timeout([full]),
                                              work_timeout([full, replace(full, variant="repeat_kv")]))
    assert TIMEOUT_FIXED_S < t_tiny < t_full
    assert t_two - TIMEOUT_FIXED_S == pytest.approx(2 * (t_full - TIMEOUT_FIXED_S))
    assert why.startswith(f"{TIMEOUT_FIXED_S:.0f} s + {TIMEOUT_FACTOR:.0f} x the estimated ")


@pytest.mark.conversion
def test_two_identical_builds_at_once_give_one_build_and_truthful_messages(tmp_path):
    args = [sys.executable, "-m", "analyzer", "build", "--model", DEFAULT_PRESET, "--variant", "qfold",
            "--ctx", str(TINY_CTX), "--builds-dir", str(tmp_path), "--steps", "2"]
    for o in TINY_OVERRIDES:
        args += ["--set", o]
    procs = [subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    folders = {o[0].strip().splitlines()[-1] for o in outs}
    assert len(folders) == 1 and Path(folders.pop()).is_dir()
    said = sorted(next(ln.split()[0] for ln in o[1].splitlines() if ln.split()[:1] in (["built"], ["reused"]))
                  for o in outs)
    assert said == ["built", "reused"], [o[1][-500:] for o in outs]
    key = list_builds(tmp_path)[0].build.key
    logs = sorted((tmp_path / ".logs").glob(f"{key}.*.log"))
    assert len(logs) == 2  # one log per request: neither truncated the other
    texts = [p.read_text() for p in logs]
    assert sum("reusing" in t for t in texts) == 1 and sum('"stage": "convert"' in t for t in texts) == 1
    assert latest_log(tmp_path, key) in logs


STAGES = ("model", "equivalence", "convert", "save", "walk", "check")


@pytest.mark.conversion
def test_kill_9_at_every_stage_leaves_nothing_listed_and_the_next_build_works(tmp_path):
    # 3 layers: a model larger than the reduced one, so its equivalence check runs in a worker process, killed too
    spec = BuildSpec(resolve_source(DEFAULT_PRESET, (*TINY_OVERRIDES, "num_hidden_layers=3")), "repeat_kv", "state",
                     TINY_CTX, equivalence_steps=2)
    assert not is_reduced_size(spec)
    request = tmp_path / "request.json"
    request.write_text(json.dumps(spec.to_json()))
    killed_at = []
    for stage in STAGES:
        # as the launcher starts it: forked by the fork server on Linux (a new process elsewhere)
        proc = start_child([sys.executable, "-m", "analyzer.convert.child", str(request), str(tmp_path)],
                           child_env(), REPO)
        try:
            for line in proc.stdout:
                if f'"stage": "{stage}"' in line:
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed_at.append(stage)
                    break
        finally:
            proc.kill()
            proc.wait(timeout=60)
        assert list_builds(tmp_path) == [], stage
        assert not (tmp_path / spec.key).exists(), stage
        # killed while starting its equivalence worker, the child leaves a forked, not yet exec'd process holding a
        # copy of the key lock's descriptor; killed too, it is torn down a moment after the child (not our child,
        # so not waited for): the lock must be released within the deadline, then the entry has no live owner
        deadline = time.monotonic() + 30
        while lock_is_held(tmp_path, spec.key) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert queue(tmp_path) == [], stage  # the killed child's entry has no live owner
    assert killed_at == list(STAGES)
    assert list(tmp_path.glob(".tmp-*"))  # leftovers of the killed attempts...
    result = run_build(spec, tmp_path)
    assert not result.reused and [a.build.key for a in list_builds(tmp_path)] == [spec.key]
    assert not list(tmp_path.glob(".tmp-*"))  # ...swept by the next build, which holds the key's lock


def test_listing_parses_an_analysis_again_only_when_it_changed(tiny_builds, tmp_path):
    """The dashboard lists the builds folder on every rerun: an unchanged analysis.json is not parsed again (the
    same record comes back), a rewritten one is, and a removed build leaves the listing."""
    root = tmp_path / "builds"
    for path in tiny_builds.values():
        shutil.copytree(path, root / path.name, ignore=shutil.ignore_patterns("*.mlpackage"))
    first = {a.build.key: a for a in list_builds(root)}
    assert set(first) == {p.name for p in tiny_builds.values()}
    assert all(a is first[a.build.key] for a in list_builds(root))
    qfold, repeat_kv = tiny_builds["qfold"].name, tiny_builds["repeat_kv"].name
    f = root / qfold / "analysis.json"
    doc = json.loads(f.read_text())
    doc["created"] = "2099-01-01T00:00:00+00:00"
    (root / qfold / "new.json").write_text(json.dumps(doc))
    (root / qfold / "new.json").replace(f)  # as every writer does: a new file renamed into place
    rewritten = {a.build.key: a for a in list_builds(root)}
    assert rewritten[qfold].build.created == "2099-01-01T00:00:00+00:00" and rewritten[qfold] is not first[qfold]
    assert rewritten[repeat_kv] is first[repeat_kv]
    shutil.rmtree(root / repeat_kv)
    assert [a.build.key for a in list_builds(root)] == [qfold]
