"""Sweeps: the spec, the table, the memory admission, and real sweeps on a local in-process Ray cluster.

The default-suite sweep runs the 2-layer tiny config (conftest TINY_OVERRIDES) at ctx {256, 512} × {repeat_kv,
qfold} in the session's builds folder: the ctx-256 pair is the session's ``tiny_builds`` (reused), the ctx-512 pair
is built on Ray, and one injected point (a model folder whose safetensors file is corrupt) fails inside its
worker. The derived-points tests sweep ctx {256, 512, 640, 768, 1024} of repeat_kv: 256 and 512 are those builds,
768 converts for the law's check, and 640 and 1024 are derived, then held against their direct builds. The
structure-size sweep of the issue (30 layers, ctx {512, 1024, 2048, 4096}) takes ~7 min today and runs
with QFOLD_STRUCTURE_SWEEP=1; it becomes cheap once value-free analysis builds land.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import fields, replace
from pathlib import Path

import pandas as pd
import psutil
import pytest

from analyzer.analysis.accounting import CATEGORIES
from analyzer.analysis.ctx_affine import canonical, same_program
from analyzer.analysis.record import load_analysis, write_analysis
from analyzer.convert.launch import list_builds, run_builds
from analyzer.errors import QfoldError
from analyzer.model.sources import DEFAULT_PRESET, STRUCTURE_OVERRIDES, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, BuildSpec
from analyzer.predict.profiles import DEFAULT_PROFILE, get_profile, load_profiles, parse_profiles
from analyzer.sweep.derive import DERIVED_DIR
from analyzer.sweep.driver import RayOptions, build_memory_bytes, describe_progress, run_sweep
from analyzer.sweep.grid import (
    DIMENSION_NAMES,
    SweepError,
    SweepPoint,
    make_spec,
    read_spec_file,
)
from analyzer.sweep.ray_workers import equivalence_groups, store_analysis
from analyzer.sweep.table import SweepRow, check_table_path, finished_row, read_table, write_table
from tests.conftest import TINY_CTX, TINY_OVERRIDES

REPO = Path(__file__).resolve().parent.parent
PRESET_JSON = REPO / "analyzer" / "model" / "presets" / f"{DEFAULT_PRESET}.json"


# ------------------------------------------------------------------------------------------------- spec
def test_point_fields_follow_the_dimensions_registry():
    assert [f.name for f in fields(SweepPoint)] == list(DIMENSION_NAMES)


def test_flags_make_a_grid_with_defaults_and_compression_specs_are_never_split():
    spec = make_spec({"model": ["a-model"], "ctx": ["512,1024", "2048"],
                      "compression": ["none", "ffn=pal4,attn=int8"]})
    assert spec.values("variant") == ("repeat_kv", "qfold")
    assert spec.values("ctx") == (512, 1024, 2048)
    assert spec.values("compression") == ("none", "ffn=pal4,attn=int8")
    points = spec.points()
    assert len(points) == 1 * 2 * 2 * 3
    assert points[0] == SweepPoint("a-model", "none", "repeat_kv", 512)  # ctx innermost
    assert make_spec({}).values("model") == (DEFAULT_PRESET,) and make_spec({}).values("ctx") == (4096,)


@pytest.mark.parametrize(("values", "needle"), [
    ({"ctx": ["512,abc"]}, "ctx 'abc'"),
    ({"ctx": [0]}, "ctx '0'"),
    ({"variant": ["repeat_kv,nope"]}, "variant 'nope'"),
    ({"phase": ["decode,nope"]}, "phase 'nope'"),
    ({"q_len": 0}, "q_len=0"),
    ({"prompt": 1}, "unknown sweep key(s) 'prompt'"),
    ({"structure": "yes"}, "structure='yes'"),
    ({"model": [""]}, "empty value"),
])
def test_bad_spec_values_are_named(values, needle):
    with pytest.raises(SweepError, match=None) as e:
        make_spec(values)
    assert needle in str(e.value)


def test_spec_files_toml_and_json_match_the_flags(tmp_path):
    toml = tmp_path / "s.toml"
    toml.write_text('model = ["exaone-4.0-1.2b"]\nctx = [512, 1024]\nvariant = ["qfold"]\n'
                    'compression = ["none", "top8"]\nstructure = true\nset = ["num_hidden_layers=2"]\n'
                    'out = "table.csv"\n')
    spec, out = read_spec_file(toml)
    assert out == "table.csv" and spec.structure and spec.overrides == ("num_hidden_layers=2",)
    js = tmp_path / "s.json"
    js.write_text(json.dumps(spec.to_json()))
    assert read_spec_file(js)[0] == spec
    bad = tmp_path / "bad.toml"
    bad.write_text("ctx = [512\n")
    with pytest.raises(SweepError, match="not valid TOML"):
        read_spec_file(bad)
    with pytest.raises(SweepError, match="unknown sweep key"):
        read_spec_file(_write(tmp_path / "u.json", {"ctxs": [1]}))


def _write(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


# ------------------------------------------------------------------------------------------------- table
def _row(variant: str, ctx: int, status="built") -> SweepRow:
    b = {"weights": 100, "kv_read": 10 * ctx, "kv_write": 4, "replication": 80 * ctx if variant == "repeat_kv" else 0,
         "activations": 7}
    b["total"] = sum(b.values())
    return SweepRow(SweepPoint("m", "none", variant, ctx), status, key=f"k-{variant}-{ctx}", tile_count=4,
                    bytes=tuple(b.items()), flops=(("total", 1.5e6),), predicted_tok_per_s=1.0 / b["total"])


@pytest.mark.parametrize("suffix", [".csv", ".json", ".parquet"])
def test_table_round_trips_with_the_contract_columns(tmp_path, suffix):
    rows = [_row("repeat_kv", 512), _row("qfold", 512), SweepRow(SweepPoint("m", "x", "qfold", 1), "failed",
                                                                 error="=cmd|bad")]
    path = write_table(rows, tmp_path / f"t{suffix}")
    frame = read_table(path)
    for col in ("model", "variant", "ctx", "compression", "key", "status", "tile_count", "predicted_tok_per_s",
                "flops_total", *(f"bytes_{c}" for c in (*CATEGORIES, "total"))):
        assert col in frame.columns, col
    assert frame["bytes_replication"].tolist()[:2] == [80 * 512, 0]
    assert list(frame["status"]) == ["built", "built", "failed"]
    if suffix == ".csv":  # formula-like text is escaped on export
        assert "'=cmd|bad" in path.read_text()


def test_table_path_is_checked_before_any_work(tmp_path):
    with pytest.raises(SweepError, match="by suffix"):
        check_table_path(tmp_path / "t.xlsx")
    with pytest.raises(SweepError, match="does not exist"):
        check_table_path(tmp_path / "nope" / "t.csv")
    with pytest.raises(SweepError, match="missing column"):
        read_table(_write(tmp_path / "x.json", [{"model": "m"}]))


# ------------------------------------------------------------------------------------------------- profiles
def test_example_profiles_are_cited_and_typed():
    profiles = load_profiles()
    assert get_profile("writeup-ab-iphone").bytes_per_s == 55_900_000_000
    kinds = {p.kind for p in profiles.values()}
    assert {"measured", "datasheet", "assumed"} <= kinds
    assert all(p.source and p.bytes_per_s > 0 for p in profiles.values())
    assert profiles["m1-max-soc"].bytes_per_s == 400_000_000_000 and profiles["m1-max-ane"].kind == "measured"
    with pytest.raises(QfoldError, match="no such device profile"):
        get_profile("m9-ane")
    bad = "key,device,unit,kind,bytes_per_s,source,url,read_on,note\nx,X,ANE,guessed,1,src,,,\n"
    with pytest.raises(QfoldError, match=r"<t>:2, column 'kind', value 'guessed'"):
        parse_profiles(bad, "<t>")


# ------------------------------------------------------------------------------------------------- memory
def test_memory_reservation_is_the_measured_peak_of_a_full_size_build():
    """Ray reserves what cost.estimate predicts; the prediction is checked against the peak measured by
    bench/cost_model.py (the full-size materialised build with coremltools' shortcuts: ~4.5 GB, not the 14.7 GB
    of the plain pass pipeline design.md measured first)."""
    full = resolve_source(DEFAULT_PRESET)
    structure = resolve_source(DEFAULT_PRESET, STRUCTURE_OVERRIDES)
    full_mem = build_memory_bytes(BuildSpec(full, "qfold"))
    structure_mem = build_memory_bytes(BuildSpec(structure, "qfold"))
    rows = json.loads((REPO / "bench" / "results" / "cost_model.json").read_text())["rows"]
    measured = rows["coreml-mat-exaone-qfold"]["peak_rss_tree_bytes"]
    assert abs(full_mem - measured) / measured < 0.25, (full_mem, measured)
    assert 0.6e9 < structure_mem < 2e9  # design.md: ≈ 1 GB
    assert full_mem > 2 * structure_mem


def test_points_that_share_an_equivalence_check_are_grouped():
    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    specs = [BuildSpec(src, v, "state", c) for c in (256, 512) for v in ("repeat_kv", "qfold")]
    assert equivalence_groups(specs) == [[0, 1], [2, 3]]


# ------------------------------------------------------------------------------------------------- real sweeps
def _corrupt_model(folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(PRESET_JSON.read_text())
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    return folder


def _ray_children() -> list[str]:
    names = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "ray" in cmd and ("raylet" in cmd or "gcs_server" in cmd or "default_worker" in cmd):
            names.append(cmd[:80])
    return names


@pytest.fixture(scope="module")
def tiny_sweep(tiny_analysis_builds, builds_root, tmp_path_factory):
    """One sweep on local Ray (analysis mode, its default): ctx {256, 512} × both variants, plus a point whose
    safetensors cannot be read, which fails in its worker."""
    scratch = tmp_path_factory.mktemp("scratch")
    os.environ["QFOLD_SWEEP_SCRATCH"] = str(scratch)
    spec = make_spec({"ctx": [TINY_CTX, 2 * TINY_CTX], "structure": True, "set": ["num_hidden_layers=2"]})
    bad = SweepPoint(str(_corrupt_model(tmp_path_factory.mktemp("bad") / "corrupt")), "none", "qfold", 2 * TINY_CTX)
    events = []
    result = run_sweep(spec, builds_root, points=(*spec.points(), bad), on_event=events.append,
                       ray_options=RayOptions(num_cpus=2, memory_bytes=6 * 2**30))
    yield spec, result, events, scratch
    os.environ.pop("QFOLD_SWEEP_SCRATCH", None)


@pytest.mark.conversion
def test_sweep_builds_on_ray_into_the_driver_builds_dir_with_build_keys(tiny_sweep, tiny_analysis_builds,
                                                                        builds_root):
    _spec, result, events, scratch = tiny_sweep
    rows = {(r.point.variant, r.point.ctx, r.point.model == DEFAULT_PRESET): r for r in result.rows}
    assert len(result.rows) == 5 and result.used_ray
    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    for variant in ("repeat_kv", "qfold"):
        reused, built = rows[(variant, TINY_CTX, True)], rows[(variant, 2 * TINY_CTX, True)]
        assert reused.status == "reused" and reused.path == str(tiny_analysis_builds[variant])
        assert built.status == "built", built.error
        # the key `build` would use (analysis mode: the default of both)
        assert built.key == BuildSpec(src, variant, "state", 2 * TINY_CTX, build_mode=ANALYSIS_MODE).key
        folder = builds_root / built.key
        assert (folder / "analysis.json").is_file() and (folder / "build.log").is_file()
        assert not (folder / "model.mlpackage").exists()  # analyses travel, weights do not
        assert json.loads((folder / "analysis.json").read_text())["key"] == built.key
        assert built.bytes_of("kv_read") == 2 * reused.bytes_of("kv_read")  # KV read scales with ctx
        assert built.predicted_tok_per_s == pytest.approx(55.9e9 / built.bytes_of("total"))
    assert rows[("repeat_kv", 2 * TINY_CTX, True)].tile_count == 4  # 2 layers × (K, V)
    assert rows[("qfold", 2 * TINY_CTX, True)].tile_count == 0
    assert rows[("repeat_kv", 2 * TINY_CTX, True)].bytes_of("replication") > 0
    assert rows[("qfold", 2 * TINY_CTX, True)].bytes_of("replication") == 0
    # the worker ran on this host: the equivalence check of ctx 512 is cached in the driver's builds dir
    assert any((builds_root / ".equivalence").glob("*.json"))
    assert not list(scratch.glob("task-*")), "scratch folders (with the .mlpackage) must be removed"
    assert any(e.row is not None and e.row.status == "running" for e in events)  # live progress reached us
    assert not _ray_children(), "the in-process Ray cluster must be shut down"


@pytest.mark.conversion
def test_one_failing_point_is_reported_and_the_rest_kept(tiny_sweep):
    _spec, result, _events, _scratch = tiny_sweep
    failed = [r for r in result.rows if r.status == "failed"]
    assert len(failed) == 1 and failed[0].point.model.endswith("corrupt")
    assert failed[0].stage == "build" and failed[0].error.startswith(str(Path(failed[0].point.model)))
    assert result.n_failed == 1 and not result.ok and result.n_built == 2
    # value-free builds still check the files, from their headers, before any conversion child starts (no log)
    assert "model.safetensors: not a readable safetensors file" in failed[0].error and "log:" not in failed[0].error


def test_sweeps_build_in_analysis_mode_unless_told():
    assert make_spec({}).build_mode == ANALYSIS_MODE and make_spec({}).to_json()["mode"] == ANALYSIS_MODE
    assert make_spec({"mode": "materialised"}).build_mode == "materialised"
    with pytest.raises(SweepError, match="mode='fast'"):
        make_spec({"mode": "fast"})


@pytest.mark.conversion
def test_rerun_reuses_everything_without_starting_ray(tiny_sweep, builds_root):
    spec, _result, _events, _scratch = tiny_sweep
    again = run_sweep(spec, builds_root)
    assert again.n_built == 0 and again.n_reused == 4 and not again.used_ray and again.ok


@pytest.mark.conversion
def test_cli_writes_the_table_last_line_is_its_path_and_failures_exit_nonzero(tiny_sweep, builds_root, tmp_path):
    env = dict(os.environ, QFOLD_BUILDS=str(builds_root))
    base = [sys.executable, "-m", "analyzer", "sweep", "--structure", "--set", "num_hidden_layers=2",
            "--ctx", f"{TINY_CTX},{2 * TINY_CTX}", "--variant", "repeat_kv,qfold", "--device", "m1-max-ane"]
    ok = subprocess.run([*base, "--out", str(tmp_path / "t.csv")], capture_output=True, text=True, env=env,
                        cwd=REPO, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().splitlines()[-1] == str(tmp_path / "t.csv")
    assert "0 new builds" in ok.stderr
    frame = pd.read_csv(tmp_path / "t.csv")
    assert set(frame["status"]) == {"reused"} and set(frame["device_profile"]) == {"m1-max-ane"}
    bad = subprocess.run([*base, "--compression", "none", "--compression", "ffn=pal5", "--out",
                          str(tmp_path / "t.json")], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert bad.returncode == 1 and bad.stdout.strip().splitlines()[-1] == str(tmp_path / "t.json")
    table = json.loads((tmp_path / "t.json").read_text())
    assert {r["status"] for r in table} == {"reused", "failed"} and len(table) == 8
    assert "Traceback" not in bad.stderr
    usage = subprocess.run([*base, "--out", str(tmp_path / "t.xlsx")], capture_output=True, text=True, env=env,
                           cwd=REPO, timeout=120)
    assert usage.returncode == 1 and usage.stderr.strip().splitlines()[-1].startswith("error: --out")


@pytest.mark.conversion
def test_cli_sweeps_the_phase_prefill_rows_carry_flops_and_the_roofline(builds_root, tmp_path):
    """``--phase decode,prefill --q-len N``: every point is built (analysis mode, the sweep's default) with the key
    ``build --phase prefill --q-len N`` would use; bytes are per call, FLOPs per (prompt) token."""
    env = dict(os.environ, QFOLD_BUILDS=str(builds_root))
    out = tmp_path / "phases.csv"
    run = subprocess.run([sys.executable, "-m", "analyzer", "sweep", "--structure", "--set", "num_hidden_layers=2",
                          "--ctx", str(TINY_CTX), "--variant", "repeat_kv,qfold", "--phase", "decode,prefill",
                          "--q-len", "16", "--device", "m1-pro-ane", "--num-cpus", "2", "--out", str(out)],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    frame = pd.read_csv(out).set_index(["variant", "phase"])
    assert set(frame.index) == {(v, p) for v in ("repeat_kv", "qfold") for p in ("decode", "prefill")}
    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    for variant in ("repeat_kv", "qfold"):
        decode, prefill = frame.loc[(variant, "decode")], frame.loc[(variant, "prefill")]
        assert decode["key"] == BuildSpec(src, variant, "state", TINY_CTX, build_mode="analysis").key
        assert prefill["key"] == BuildSpec(src, variant, "state", TINY_CTX, phase="prefill", q_len=16,
                                           build_mode="analysis").key
        assert decode["tokens_per_call"] == 1 and prefill["tokens_per_call"] == 16
        assert prefill["bytes_total"] > decode["bytes_total"]  # per call: 16 rows of activations and KV writes
        assert 0 < decode["flops_total"] and 0 < prefill["flops_total"]
        assert prefill["flops_projections"] == pytest.approx(decode["flops_projections"], rel=0.01)  # per token
        assert prefill["bound"] in ("memory", "compute") and prefill["roofline_tok_per_s"] > 0
        assert prefill["predicted_tok_per_s"] == pytest.approx(16 * 54.9e9 / prefill["bytes_total"])
    assert frame.loc[("repeat_kv", "prefill"), "bytes_replication"] > 0  # its 4 K/V tiles (2 layers)
    assert frame.loc[("qfold", "prefill"), "bytes_replication"] == 0  # (its one tile broadcasts the mask rows)


def test_store_analysis_refuses_a_worker_with_other_tool_versions(tmp_path):
    with pytest.raises(SweepError, match="tool versions differ"):
        store_analysis(tmp_path, "model-qfold-abc", json.dumps({"key": "model-qfold-def"}), "")
    path = store_analysis(tmp_path, "model-qfold-abc", json.dumps({"key": "model-qfold-abc"}), "log\n")
    assert path == tmp_path / "model-qfold-abc" and (path / "build.log").read_text() == "log\n"
    assert store_analysis(tmp_path, "model-qfold-abc", json.dumps({"key": "model-qfold-abc", "x": 1}), "") == path
    assert "x" not in json.loads((path / "analysis.json").read_text())  # a finished build is never overwritten


# ------------------------------------------------------------------------------------------------- derived points
# Issue 23, item 3 (analyzer.sweep.derive): one graph at five ctx values converts three, derives two.
SWEEP_CTX = (256, 512, 640, 768, 1024)
CONVERTED, DERIVED = (256, 512, 768), (640, 1024)  # the law's two points, then its check; 1024 = the largest ctx


@pytest.fixture(scope="module")
def direct(tiny_sweep, builds_root, tmp_path_factory) -> dict[int, Path]:
    """Every point of the sweep converted, as `build --ctx N` makes them (analysis mode): 256 and 512 are the
    module's sweep's builds; 768 and the two derived points are converted here, in one child."""
    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    specs = {c: BuildSpec(src, "repeat_kv", "state", c, build_mode=ANALYSIS_MODE) for c in SWEEP_CTX}
    out = {c: builds_root / specs[c].key for c in (256, 512)}
    new = [specs[c] for c in (768, *DERIVED)]
    out.update({s.ctx: r.path for s, r in zip(new, run_builds(new, tmp_path_factory.mktemp("direct")), strict=True)})
    return out


def _sweep_root(direct: dict[int, Path], tmp_path: Path) -> Path:
    """A builds folder holding only the three points the sweep converts (as if it had converted them)."""
    root = tmp_path / "builds"
    root.mkdir()
    for ctx in CONVERTED:
        shutil.copytree(direct[ctx], root / direct[ctx].name)
    return root


def _spec():
    return make_spec({"ctx": [",".join(map(str, SWEEP_CTX))], "variant": ["repeat_kv"], "structure": True,
                      "set": ["num_hidden_layers=2"]})


@pytest.mark.conversion
def test_derived_rows_equal_direct_builds_and_are_marked(direct, tmp_path):
    root = _sweep_root(direct, tmp_path)
    events = []
    result = run_sweep(_spec(), root, on_event=events.append, ray_options=RayOptions(address="127.0.0.1:1"))
    assert not result.used_ray and result.n_built == 0 and result.n_reused == 3 and result.n_derived == 2
    rows = {r.point.ctx: r for r in result.rows}
    profile = get_profile(DEFAULT_PROFILE)
    for ctx in DERIVED:  # 1024: the largest ctx, extrapolated past the check
        row, built = rows[ctx], load_analysis(direct[ctx])
        assert row.status == "derived" and row.derived_from_ctx == CONVERTED
        derived = load_analysis(row.path)
        assert Path(row.path).parent == root / DERIVED_DIR / built.build.key  # the key `build --ctx N` makes
        assert same_program(derived.program, built.program) is None  # the op table, op for op
        assert derived.program == canonical(built.program)
        assert derived.summary.op_counts == built.summary.op_counts and derived.summary.tile_count == 4
        assert derived.bytes_per_token == built.bytes_per_token  # every category
        assert derived.bytes_by_layer == built.bytes_by_layer
        assert derived.flops.per_token() == built.flops.per_token()
        same = finished_row(replace(row, status="built", derived_from_ctx=(), path="", seconds=0.0), direct[ctx],
                            profile)
        assert replace(row, status="built", derived_from_ctx=(), path="", seconds=0.0) == replace(same, path="")
        provenance = derived.build.extra["derived_from"]
        assert [p["ctx"] for p in provenance["basis"]] == [256, 512] and provenance["check"]["ctx"] == 768
        assert provenance["check"]["key"] == load_analysis(direct[768]).build.key
        assert derived.build.equivalence is None and derived.build.package_bytes is None
        assert not (root / built.build.key).exists()  # never where `build` would take it for a conversion
    assert len(list_builds(root)) == 3
    derived_events = [e for e in events if e.row is not None and e.row.status == "derived"]
    assert [e.row.point.ctx for e in derived_events] == list(DERIVED)
    assert "2 derived" in describe_progress(derived_events[-1])
    assert "derived from ctx 256 and 512 (law checked at ctx 768)" in describe_progress(derived_events[-1])
    table = pd.read_csv(write_table(result.rows, tmp_path / "t.csv"), dtype={"derived_from_ctx": str})
    marked = table.set_index("ctx")[["status", "derived_from_ctx"]].fillna("")
    assert marked.to_dict("index") == {256: {"status": "reused", "derived_from_ctx": ""},
                                       512: {"status": "reused", "derived_from_ctx": ""},
                                       640: {"status": "derived", "derived_from_ctx": "256,512,768"},
                                       768: {"status": "reused", "derived_from_ctx": ""},
                                       1024: {"status": "derived", "derived_from_ctx": "256,512,768"}}


@pytest.mark.conversion
def test_a_check_that_fails_converts_the_other_points_instead(direct, tmp_path):
    """The conversion at 768 replaced by a program that is not the graph at 768 (the one at 256): the law's check
    fails, nothing is derived, and the sweep turns to converting 640 and 1024 (here: on a Ray address that refuses
    the connection, so the attempt is all there is to see)."""
    root = _sweep_root(direct, tmp_path)
    check = root / direct[768].name
    write_analysis(check / "analysis.json", replace(load_analysis(check), program=load_analysis(direct[256]).program))
    events = []
    with pytest.raises(SweepError, match=r"cannot reach the Ray cluster at 127\.0\.0\.1:1"):
        run_sweep(_spec(), root, on_event=events.append, ray_options=RayOptions(address="127.0.0.1:1"))
    messages = [e.message for e in events if e.message]
    refusal = next(m for m in messages if "not derived" in m)
    assert "derived at ctx 768 from ctx 256 and 512, the program differs from its conversion" in refusal
    assert refusal.endswith("converting ctx 640, 1024 instead")
    assert not (root / DERIVED_DIR).exists()


# ------------------------------------------------------------------------------------------------- structure size
@pytest.mark.conversion
@pytest.mark.skipif(os.environ.get("QFOLD_STRUCTURE_SWEEP") != "1",
                    reason="8 structure builds (30 layers, ctx up to 4096): 249 s in analysis mode on this 2-core "
                           "machine, over the default suite's budget; set QFOLD_STRUCTURE_SWEEP=1")
def test_structure_sweep_of_the_default_preset(builds_root, tmp_path):
    spec = make_spec({"ctx": [512, 1024, 2048, 4096], "structure": True})
    bad = SweepPoint(str(_corrupt_model(tmp_path / "corrupt")), "none", "qfold", 512)
    result = run_sweep(spec, builds_root, points=(*spec.points(), bad), ray_options=RayOptions(num_cpus=2))
    ok = [r for r in result.rows if r.ok]
    assert len(ok) == 8 and result.n_failed == 1
    tiles = {(r.point.variant, r.point.ctx): (r.tile_count, r.bytes_of("replication")) for r in ok}
    for ctx in (512, 1024, 2048, 4096):
        assert tiles[("repeat_kv", ctx)] == (60, 60 * 2 * 8 * 4 * ctx * 64 * 2)  # write + read of 60 tiles
        assert tiles[("qfold", ctx)] == (0, 0)
    again = run_sweep(spec, builds_root)
    assert again.n_built == 0 and again.n_reused == 8
