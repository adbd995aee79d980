"""Builds through the child process: keys, reuse, interrupted builds, failures, and the CLI contract."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from analyzer.analysis.record import ANALYSIS_FILE
from analyzer.convert.builds_folder import clean_stale_tmp
from analyzer.convert.launch import PACKAGE_NAME, run_build
from analyzer.errors import BuildError
from analyzer.model.sources import DEFAULT_PRESET, resolve_source
from analyzer.model.spec import BuildSpec
from tests.cli_batch import run_batch

from .conftest import TINY_CTX, TINY_OVERRIDES

pytestmark = pytest.mark.conversion
REPO = Path(__file__).resolve().parent.parent


def _cli(*args, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "analyzer", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}, timeout=timeout)


def test_keys_hash_what_changes_the_result():
    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    base = BuildSpec(src, "qfold", "state", 256)
    assert base.key == BuildSpec(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES), "qfold", "state", 256).key
    others = [BuildSpec(src, "repeat_kv", "state", 256), BuildSpec(src, "qfold", "input", 256),
              BuildSpec(src, "qfold", "state", 512),
              BuildSpec(resolve_source(DEFAULT_PRESET, [*TINY_OVERRIDES, "rms_norm_eps=1e-6"]), "qfold", "state", 256),
              BuildSpec(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES, seed=1), "qfold", "state", 256)]
    assert len({base.key, *(o.key for o in others)}) == 1 + len(others)
    assert base.key.startswith("exaone-4.0-1.2b-qfold-state-ctx256-")


def test_build_folder_is_complete_and_reused(tiny_builds, builds_root):
    path = tiny_builds["qfold"]
    assert (path / ANALYSIS_FILE).is_file() and (path / PACKAGE_NAME / "Manifest.json").is_file()
    assert (path / "build.log").is_file()
    # the pair shares one equivalence check (it does not depend on the variant built): one child made both, and
    # checked once (or reused the check of an earlier build of this geometry)
    log = (path / "build.log").read_text()
    assert log.count("checking the variants' equivalence") + log.count("reusing the equivalence check") == 1, log
    assert f"done: {tiny_builds['repeat_kv']}" in log  # the first variant's build, in the same child's log
    doc = json.loads((path / ANALYSIS_FILE).read_text())
    other = json.loads((tiny_builds["repeat_kv"] / ANALYSIS_FILE).read_text())["equivalence"]
    torch_report = ("kv_mode", "ctx", "steps", "tokens", "pairs")  # "checks" adds each package's own interpreter check
    assert {k: doc["equivalence"][k] for k in torch_report} == {k: other[k] for k in torch_report}
    assert doc["key"] == path.name and doc["spec"]["variant"] == "qfold"
    assert doc["peak_rss_bytes"] > 0 and doc["timings"]["convert_s"] > 0
    t0 = time.monotonic()
    again = run_build(BuildSpec(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES), "qfold", "state", TINY_CTX),
                      builds_root)
    assert again.reused and again.path == path and time.monotonic() - t0 < 5
    # none of this build's (the shared folder may hold another worker's build in progress)
    assert not list(builds_root.glob(f".tmp-{again.key}-*"))


def test_killed_build_leaves_nothing_that_looks_finished(tmp_path):
    source = resolve_source(DEFAULT_PRESET, [*TINY_OVERRIDES[:3], "num_hidden_layers=8"])
    spec = BuildSpec(source, "qfold", "state", 512)
    request = tmp_path / "request.json"
    request.write_text(json.dumps(spec.to_json()))
    proc = subprocess.Popen([sys.executable, "-m", "analyzer.convert.child", str(request), str(tmp_path)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO, start_new_session=True)
    try:
        for line in proc.stdout:  # wait until the conversion itself is under way
            if '"stage": "convert"' in line:
                break
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert not (tmp_path / spec.key).exists()
    leftovers = list(tmp_path.glob(".tmp-*"))
    assert leftovers and not (leftovers[0] / ANALYSIS_FILE).exists()
    assert clean_stale_tmp(tmp_path) == leftovers  # the next build sweeps them
    assert not list(tmp_path.glob(".tmp-*"))


def test_failed_build_reports_why_and_caches_nothing(tmp_path):
    src = resolve_source(DEFAULT_PRESET, [*TINY_OVERRIDES, "hidden_act=not_an_activation"])
    with pytest.raises(BuildError, match="not_an_activation"):
        run_build(BuildSpec(src, "qfold", "state", 64), tmp_path)
    assert not (tmp_path / BuildSpec(src, "qfold", "state", 64).key).exists()
    assert not list(tmp_path.glob(".tmp-*"))


def test_cli_build_prints_the_folder_last_and_inspect_diff_speak_json(tiny_builds, builds_root):
    out = _cli("build", "--mode", "materialised", "--variant", "repeat_kv", "--ctx", str(TINY_CTX), "--structure",
               "--set", "num_hidden_layers=2", "--builds-dir", str(builds_root))
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip().splitlines()[-1]) == tiny_builds["repeat_kv"]
    assert "reused" in out.stderr

    a = json.loads(_cli("inspect", str(tiny_builds["repeat_kv"]), "--json").stdout)
    assert a["total_ops"] == sum(a["op_counts"].values()) and a["op_counts"]["const"] > 0
    assert len(a["tiles"]) == 4 and a["tile_output_bytes"] == 4 * 8 * 4 * TINY_CTX * 64 * 2
    assert set(a["tiles"][0]) >= {"name", "layer", "input_shape", "output_shape", "dtype", "output_bytes", "kind"}
    assert set(a["bytes_per_token"]) == {"weights", "kv_read", "kv_write", "kv_write_value_semantics",
                                         "replication", "activations", "total"}
    # the same analysis straight from the .mlpackage (as for a package built by another tool)
    direct = json.loads(_cli("inspect", str(tiny_builds["repeat_kv"] / PACKAGE_NAME), "--json").stdout)
    assert direct["op_counts"] == a["op_counts"] and direct["bytes_per_token"] == a["bytes_per_token"]

    d = json.loads(_cli("diff", str(tiny_builds["repeat_kv"]), str(tiny_builds["qfold"]), "--json").stdout)
    assert d["tile_count"] == {"a": 4, "b": 0, "delta": -4}
    assert d["tile_bytes_removed"] == a["tile_output_bytes"]
    assert d["bytes_per_token"]["replication"]["delta"] == -2 * a["tile_output_bytes"]
    assert {r["type"]: r["delta"] for r in d["op_count_deltas"]}["tile"] == -4

    ops = json.loads(_cli("inspect", str(tiny_builds["repeat_kv"]), "--ops", "--json").stdout)["ops"]
    assert sum(o["total"] for o in ops) == a["bytes_per_token"]["total"]
    csv_text = _cli("inspect", str(tiny_builds["repeat_kv"]), "--csv").stdout
    assert csv_text.splitlines()[0].startswith("index,name,type,layer,rule,weights")
    assert len(csv_text.splitlines()) == len(ops) + 1


BAD_ARGUMENTS = [
    (("build", "--variant", "nope"), 2, "invalid choice: 'nope'"),
    (("build", "--variant", "qfold", "--ctx", "0"), 2, "must be at least 1"),
    (("build", "--variant", "qfold", "--set", "num_key_value_heads=5"), 1, "not divisible"),
    (("build", "--variant", "qfold", "--model", "/no/such/thing"), 1, "not a preset"),
    (("inspect", "/no/such/path"), 1, "not an .mlpackage"),
    (("frobnicate",), 2, "invalid choice"),
]


@pytest.fixture(scope="module")
def bad_argument_runs() -> dict[tuple[str, ...], dict]:
    """Each bad command line through ``analyzer.cli.main`` as ``python -m analyzer`` runs it (exit code, stdout,
    stderr, any traceback), in one long-lived child (tests/cli_batch.py) instead of a Python per case."""
    results = run_batch([{"argv": list(args), "timeout_s": 60} for args, _, _ in BAD_ARGUMENTS], workers=1)
    return {args: r for (args, _, _), r in zip(BAD_ARGUMENTS, results, strict=True)}


@pytest.mark.parametrize(("args", "code", "needle"), BAD_ARGUMENTS)
def test_bad_arguments_exit_nonzero_with_one_line(args, code, needle, bad_argument_runs):
    out = bad_argument_runs[args]
    assert out["code"] == code and out["traceback"] is None and out["killed"] is None, out
    lines = out["stderr"].strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], out["stderr"]
    assert "Traceback" not in out["stderr"]


def test_a_relative_builds_dir_is_the_callers_folder(tmp_path):
    """``--builds-dir rel`` from another working directory: the conversion child runs in the checkout, so the
    folder must be the caller's ``./rel`` (every build with a relative folder failed, its request file not found)."""
    sets = [x for o in TINY_OVERRIDES for x in ("--set", o)]
    r = subprocess.run([sys.executable, "-m", "analyzer", "build", "--variant", "qfold", "--ctx", str(TINY_CTX), *sets,
                        "--builds-dir", "rel"], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    folder = Path(r.stdout.strip().splitlines()[-1])
    assert folder.parent == tmp_path / "rel" and (folder / ANALYSIS_FILE).is_file()
