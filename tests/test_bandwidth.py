"""Bandwidth model, fits and the ``fit`` CLI, checked against the write-up's published cross-check."""

from __future__ import annotations

import argparse
import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from analyzer.cli.fit import add_parser as add_fit_parser
from analyzer.cli.fit import run_fit
from analyzer.measure.logs import BuildDeviceSummary, parse_log, summarize
from analyzer.predict.bandwidth_model import (
    BANDWIDTH_PRESETS,
    DEFAULT_BANDWIDTH_PRESET,
    WRITEUP_AB_IPHONE,
    BandwidthAssumption,
    fixed_assumption,
    inferred_bytes_per_token,
    predicted_tok_per_s,
    preset_assumption,
)
from analyzer.predict.crosscheck import ab_crosscheck, crosscheck
from analyzer.predict.fit import FitPoint, bandwidth_per_device, bandwidth_report, fit_bandwidth, fit_devices
from analyzer.report.catalog import SHIPPED_DIR, shipped_name

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "writeup_device_logs.csv"
MB = 10**6
MIB = 2**20
AB_DEVICE = "iPhone (A/B device, unnamed in write-up)"
RKV, QFOLD = "exaone-repeat_kv-top8", "exaone-qfold-top8"
TILE_BYTES = 1_920 * MIB  # 60 tiles × 16 MiB written + read again: the write-up's graph figure
assert TILE_BYTES == 2_013_265_920
# Any total works for the A/B: only the difference between the two builds is compared.
QFOLD_GRAPH_BYTES = 1_000_000_000
RKV_GRAPH_BYTES = QFOLD_GRAPH_BYTES + TILE_BYTES


def summary(build: str, device: str, tok: float, n: int = 1) -> BuildDeviceSummary:
    return BuildDeviceSummary(build, device, n, tok, 0.0, tok, tok)


# ---------------------------------------------------------------------------------------------
# The model and the preset


def test_preset_is_the_writeups_cited_constant() -> None:
    assert DEFAULT_BANDWIDTH_PRESET is WRITEUP_AB_IPHONE
    assert BANDWIDTH_PRESETS == {"writeup-ab-iphone": WRITEUP_AB_IPHONE}
    assert WRITEUP_AB_IPHONE.bytes_per_s == 55_900 * MB
    assert "section 4" in WRITEUP_AB_IPHONE.source and "OptAI" in WRITEUP_AB_IPHONE.source
    assert "2026-11-30" in WRITEUP_AB_IPHONE.source
    assert "not a datasheet" in WRITEUP_AB_IPHONE.caveat
    assert "10^6 bytes" in WRITEUP_AB_IPHONE.label


def test_predicted_and_inferred_are_inverse() -> None:
    bw, t0 = 60e9, 0.002
    assert predicted_tok_per_s(bw, 3 * 10**9) == pytest.approx(20.0)
    assert predicted_tok_per_s(bw, 3 * 10**9, t0) == pytest.approx(1 / 0.052)
    for bytes_per_token in (10**6, 987_654_321, 4 * 10**9):
        tok = predicted_tok_per_s(bw, bytes_per_token, t0)
        assert inferred_bytes_per_token(bw, tok, t0) == pytest.approx(bytes_per_token, abs=1)
        assert isinstance(inferred_bytes_per_token(bw, tok, t0), int)


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (lambda: predicted_tok_per_s(0, 10), ValueError, "bw_bytes_per_s must be a finite number > 0"),
        (lambda: predicted_tok_per_s(math.inf, 10), ValueError, "bw_bytes_per_s"),
        (lambda: predicted_tok_per_s(1e9, 1.5), TypeError, "bytes_per_token must be an int"),
        (lambda: predicted_tok_per_s(1e9, 0), ValueError, "bytes_per_token must be > 0"),
        (lambda: predicted_tok_per_s(1e9, 10, -1.0), ValueError, "overhead_s must be"),
        (lambda: inferred_bytes_per_token(1e9, 0.0), ValueError, "tok_per_s must be a finite number > 0"),
        (lambda: inferred_bytes_per_token(1e9, 100.0, 0.01), ValueError, "no time is left"),
    ],
)
def test_model_refuses_bad_inputs_specifically(call, error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        call()


# ---------------------------------------------------------------------------------------------
# The write-up's cross-check (section 4)


def test_writeup_ab_crosscheck_at_55900_mb_per_s() -> None:
    pair = ab_crosscheck(device=AB_DEVICE, build_a=RKV, tok_per_s_a=20.39, build_b=QFOLD, tok_per_s_b=54.30,
                         bandwidth=preset_assumption(), graph_diff_bytes=TILE_BYTES)
    # Exact: 55,900 MB/s ÷ tok/s.
    assert pair.inferred_bytes_per_token_b == round(55_900e6 / 54.30) == 1_029_465_930
    assert pair.inferred_bytes_per_token_a == round(55_900e6 / 20.39) == 2_741_539_971
    assert pair.inferred_bytes_per_token_b / MB == pytest.approx(1_029.47, abs=0.005)
    assert pair.inferred_bytes_per_token_a / MB == pytest.approx(2_741.54, abs=0.005)
    # The write-up's stated figures, each within its last printed digit (1 MB): 1,030 MB (1,029.47),
    # 2,742 MB (2,741.54), difference 1,712 MB (1,712.07), graph ≈ 2,013 MB (2,013.27).
    assert pair.inferred_bytes_per_token_b / MB == pytest.approx(1_030, abs=1)
    assert pair.inferred_bytes_per_token_a / MB == pytest.approx(2_742, abs=1)
    assert pair.inferred_diff_bytes / MB == pytest.approx(1_712, abs=1)
    assert TILE_BYTES / MB == pytest.approx(2_013, abs=1)
    # "approximately 15% smaller": exactly (1,712.07 − 2,013.27) / 2,013.27 = −14.96%.
    expected_pct = 100 * (55_900e6 * (1 / 20.39 - 1 / 54.30) - TILE_BYTES) / TILE_BYTES
    assert pair.gap_pct == pytest.approx(expected_pct, abs=1e-6)
    assert pair.gap_pct == pytest.approx(-14.96, abs=0.005)
    assert round(-pair.gap_pct) == 15
    assert pair.gap_bytes == pair.inferred_diff_bytes - TILE_BYTES < 0
    assert pair.speedup == pytest.approx(2.66, abs=0.005)  # "increased by 2.66 times"


def test_crosscheck_on_the_shipped_example_reproduces_the_writeup() -> None:
    imported = parse_log(EXAMPLE.read_bytes(), EXAMPLE.name)
    summaries = summarize(imported.measurements)
    graph = {RKV: RKV_GRAPH_BYTES, QFOLD: QFOLD_GRAPH_BYTES, "not-in-logs": 5}
    report = crosscheck(summaries, graph, preset_assumption())
    (pair,) = report.pairs  # only mapped builds pair up; the device table stays out
    assert (pair.device, pair.build_a, pair.build_b) == (AB_DEVICE, RKV, QFOLD)
    assert pair.graph_diff_bytes == TILE_BYTES
    assert pair.gap_pct == pytest.approx(-14.96, abs=0.005)
    rows = {(r.build, r.device): r for r in report.builds}
    assert len(rows) == 6  # unmapped builds keep their rows
    q = rows[(QFOLD, AB_DEVICE)]
    assert q.inferred_bytes_per_token == 1_029_465_930 and q.graph_bytes_per_token == QFOLD_GRAPH_BYTES
    assert q.gap_bytes == 29_465_930 and q.gap_pct == pytest.approx(2.946593)
    assert q.predicted_tok_per_s == pytest.approx(55.9)
    assert q.residual_pct == pytest.approx(100 * (54.30 - 55.9) / 54.30)
    top8 = rows[("exaone-top8-device-table", "iPhone 17 Pro")]
    assert top8.graph_bytes_per_token is None and top8.predicted_tok_per_s is None and top8.gap_pct is None
    assert top8.inferred_bytes_per_token == round(55_900e6 / 56)
    assert report.unmapped_builds == ("exaone-base-device-table", "exaone-top8-device-table")
    assert report.unused_graph_labels == ("not-in-logs",)


def test_crosscheck_per_device_bandwidth_and_overhead() -> None:
    summaries = [summary("a", "d1", 20.0), summary("b", "d1", 40.0), summary("a", "d2", 10.0)]
    bw = {"d1": BandwidthAssumption(40e9, 0.005, "fit", "test"), "d2": fixed_assumption(20e9)}
    report = crosscheck(summaries, {"a": 2 * 10**9, "b": 10**9}, bw)
    rows = {(r.build, r.device): r for r in report.builds}
    assert rows[("a", "d1")].inferred_bytes_per_token == round(40e9 * (1 / 20 - 0.005))
    assert rows[("a", "d1")].predicted_tok_per_s == pytest.approx(1 / (2e9 / 40e9 + 0.005))
    assert rows[("a", "d2")].bw_source.startswith("fixed by the user")
    (pair,) = report.pairs
    assert pair.inferred_diff_bytes == round(40e9 * (1 / 20 - 1 / 40))  # the overhead cancels
    with pytest.raises(ValueError, match="no bandwidth given for device 'd2'"):
        crosscheck(summaries, {}, {"d1": bw["d1"]})
    with pytest.raises(ValueError, match="graph bytes for build 'a'"):
        crosscheck(summaries, {"a": 0}, bw)


# ---------------------------------------------------------------------------------------------
# Fits


BYTES = [900_000_000, 1_400_000_000, 2_000_000_000, 2_900_000_000, 3_300_000_000, 4_100_000_000]


def synthetic(bw: float, t0: float, noise: float = 0.0, seed: int = 0) -> list[FitPoint]:
    rng = np.random.default_rng(seed)
    points = []
    for i, b in enumerate(BYTES):
        tok = 1.0 / (b / bw + t0)
        if noise:
            tok *= 1.0 + rng.normal(0.0, noise)
        points.append(FitPoint(f"build{i}", b, tok, n_runs=i + 1))
    return points


def test_fit_recovers_bandwidth_exactly() -> None:
    fit = fit_bandwidth("dev", synthetic(55.9e9, 0.0))
    assert fit.model == "bandwidth" and fit.physical and fit.explains_builds
    assert fit.bw_bytes_per_s == pytest.approx(55.9e9, rel=1e-6)
    assert fit.overhead_s == 0.0 and fit.max_abs_residual_pct < 1e-6
    assert fit.r_squared == pytest.approx(1.0) and fit.degrees_of_freedom == len(BYTES) - 1
    assert "one bandwidth explains the 6 builds on dev" in fit.verdict


def test_fit_recovers_bandwidth_and_overhead_exactly() -> None:
    fit = fit_bandwidth("dev", synthetic(42e9, 0.0035), overhead=True)
    assert fit.model == "bandwidth+overhead"
    assert fit.bw_bytes_per_s == pytest.approx(42e9, rel=1e-6)
    assert fit.overhead_s == pytest.approx(0.0035, rel=1e-6)
    assert all(abs(r.residual_pct) < 1e-6 for r in fit.residuals)
    # Without the overhead term the same data is explained worse.
    assert fit_bandwidth("dev", synthetic(42e9, 0.0035)).max_abs_residual_pct > 1.0


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fit_with_noise_stays_within_the_noise(seed: int) -> None:
    noise = 0.02  # 2% run-to-run spread
    fit = fit_bandwidth("dev", synthetic(55.9e9, 0.0, noise, seed))
    assert fit.bw_bytes_per_s == pytest.approx(55.9e9, rel=2 * noise)
    assert fit.max_abs_residual_pct < 100 * 4 * noise and fit.explains_builds
    two = fit_bandwidth("dev", synthetic(55.9e9, 0.002, noise, seed), overhead=True)
    assert 1 / two.bw_bytes_per_s * 4e9 + two.overhead_s == pytest.approx(4e9 / 55.9e9 + 0.002, rel=3 * noise)


def test_fit_from_a_synthetic_log_file() -> None:
    """Runs written as a CSV log, imported, summarized and fitted per device: the known BW and t0 return."""
    rng = np.random.default_rng(42)
    truth = {"iPhone 16 Pro": (45e9, 0.004), "iPhone 17 Pro": (60e9, 0.003)}
    lines = ["device,build,tok_per_s,prompt_id,context_length"]
    for device, (bw, t0) in truth.items():
        for i, b in enumerate(BYTES):
            for prompt in range(30):
                tok = 1.0 / (b / bw + t0) * (1.0 + rng.normal(0.0, 0.01))
                lines.append(f"{device},build{i},{tok!r},p{prompt},4096")
    imported = parse_log(("\n".join(lines) + "\n").encode(), "synthetic.csv")
    assert imported.issues == () and len(imported.measurements) == 2 * len(BYTES) * 30
    summaries = summarize(imported.measurements)
    graph = {f"build{i}": b for i, b in enumerate(BYTES)}
    for fit in fit_devices(summaries, graph, overhead=True):
        bw, t0 = truth[fit.device]
        assert fit.n_points == len(BYTES) and fit.n_runs == 30 * len(BYTES)
        assert fit.bw_bytes_per_s == pytest.approx(bw, rel=0.02)  # 1% noise per run, 30 runs per build
        assert fit.overhead_s == pytest.approx(t0, rel=0.15)
        assert fit.explains_builds and fit.max_abs_residual_pct < 1.0


def test_weighting_by_runs_differs_only_when_builds_disagree() -> None:
    consistent = synthetic(50e9, 0.0)
    assert fit_bandwidth("d", consistent, weighting="runs").bw_bytes_per_s == pytest.approx(
        fit_bandwidth("d", consistent).bw_bytes_per_s, rel=1e-9)
    # Two builds at 50 GB/s and one at 25 GB/s: weighting the odd one by 10 runs pulls the fit to it.
    points = [FitPoint("a", 10**9, 50.0), FitPoint("b", 2 * 10**9, 25.0),
              FitPoint("c", 3 * 10**9, 25 / 3, n_runs=10)]
    by_build = fit_bandwidth("d", points)
    by_runs = fit_bandwidth("d", points, weighting="runs")
    assert by_runs.bw_bytes_per_s < by_build.bw_bytes_per_s
    assert by_runs.weighting == "runs" and by_runs.n_runs == 12
    with pytest.raises(ValueError, match="weighting must be"):
        fit_bandwidth("d", points, weighting="n")  # type: ignore[arg-type]


def test_one_bandwidth_that_does_not_explain_the_builds_is_said_plainly() -> None:
    # Each build at its own effective bandwidth: 50, 80 and 30 GB/s.
    points = [FitPoint("a", 10**9, 50.0), FitPoint("b", 2 * 10**9, 40.0), FitPoint("c", 3 * 10**9, 10.0)]
    fit = fit_bandwidth("iPhone 16 Pro", points)
    assert fit.physical and not fit.explains_builds and fit.max_abs_residual_pct > 10
    assert fit.verdict.startswith(
        "one bandwidth does not explain these builds on iPhone 16 Pro: residuals up to")
    assert f"{fit.max_abs_residual_pct:.1f}%" in fit.verdict
    assert "the Neural Engine's effective bandwidth may differ per graph" in fit.verdict
    worst = max(fit.residuals, key=lambda r: abs(r.residual_pct))
    assert worst.residual_tok_per_s == pytest.approx(worst.measured_tok_per_s - worst.fitted_tok_per_s)
    assert worst.residual_pct == pytest.approx(100 * worst.residual_tok_per_s / worst.measured_tok_per_s)
    # A looser threshold accepts the same fit.
    assert fit_bandwidth("iPhone 16 Pro", points, max_residual_pct=1e3).explains_builds


def test_non_physical_fits_are_flagged() -> None:
    faster_with_more_bytes = [FitPoint("a", 10**9, 20.0), FitPoint("b", 2 * 10**9, 30.0),
                              FitPoint("c", 3 * 10**9, 45.0)]
    fit = fit_bandwidth("dev", faster_with_more_bytes, overhead=True)
    assert not fit.physical and not fit.usable and fit.bw_bytes_per_s < 0
    assert "non-physical" in fit.verdict and "bandwidth ≤ 0" in fit.verdict
    # t = bytes / 40 GB/s − 10 ms: a negative fixed cost.
    negative_t0 = [FitPoint(f"b{i}", b, 1 / (b / 40e9 - 0.010)) for i, b in enumerate(BYTES)]
    fit = fit_bandwidth("dev", negative_t0, overhead=True)
    assert fit.overhead_s == pytest.approx(-0.010, rel=1e-6) and not fit.physical
    assert "negative per-token overhead (-10.000 ms)" in fit.verdict
    assert "one bandwidth does not explain these builds on dev" in fit.verdict


def test_too_few_builds_gives_the_single_point_bandwidth() -> None:
    fit = fit_bandwidth("dev", [FitPoint("qfold", 1_029_465_930, 54.30)])
    assert fit.model == "single-point" and not fit.usable and not fit.explains_builds
    assert fit.bw_bytes_per_s == pytest.approx(1_029_465_930 * 54.30)
    assert fit.verdict.startswith("a fit needs ≥ 2 builds with distinct bytes/token")
    same_bytes = fit_bandwidth("dev", [FitPoint("a", 10**9, 50.0), FitPoint("b", 10**9, 40.0)])
    assert same_bytes.model == "single-point" and same_bytes.bw_bytes_per_s == pytest.approx(45e9)
    assert "2 build(s) with 1 distinct value(s)" in same_bytes.verdict
    overhead = fit_bandwidth("dev", [FitPoint("a", 10**9, 50.0)], overhead=True)
    assert overhead.verdict.startswith("an overhead term needs ≥ 2 builds with distinct bytes/token")
    with pytest.raises(ValueError, match="no builds with graph bytes"):
        fit_bandwidth("dev", [])


def test_two_parameters_through_two_points_cannot_judge() -> None:
    fit = fit_bandwidth("dev", synthetic(50e9, 0.001)[:2], overhead=True)
    assert fit.degrees_of_freedom == 0 and fit.physical and fit.usable and not fit.explains_builds
    assert "passes through every point" in fit.verdict


def test_fit_devices_and_bandwidth_choice() -> None:
    summaries = [
        summary("a", "ab", 50.0, 3), summary("b", "ab", 25.0, 3), summary("x", "ab", 10.0),
        summary("a", "solo", 30.0), summary("x", "none", 5.0),
    ]
    graph = {"a": 10**9, "b": 2 * 10**9}
    fits = {f.device: f for f in fit_devices(summaries, graph)}
    assert set(fits) == {"ab", "solo"}  # "none" has no mapped build
    assert fits["ab"].unmapped_builds == ("x",) and fits["ab"].bw_bytes_per_s == pytest.approx(50e9)
    assert fits["solo"].model == "single-point"
    chosen = bandwidth_per_device(["ab", "solo", "none"], list(fits.values()))
    assert chosen["ab"].kind == "fit" and chosen["ab"].bytes_per_s == pytest.approx(50e9)
    assert "fitted on ab" in chosen["ab"].source
    assert chosen["solo"].kind == chosen["none"].kind == "preset"
    assert chosen["solo"].bytes_per_s == 55_900e6 and "writeup-ab-iphone" in chosen["solo"].source
    fixed = bandwidth_per_device(["ab", "none"], list(fits.values()), fixed_bw_bytes_per_s=30e9)
    assert {a.kind for a in fixed.values()} == {"fixed"} and fixed["ab"].bytes_per_s == 30e9


# ---------------------------------------------------------------------------------------------
# CLI (in-process through argparse, and once as a subprocess)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="qfold")
    add_fit_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["fit", *argv])
    out, err = io.StringIO(), io.StringIO()
    assert args.func is run_fit
    code = args.func(args, out=out, err=err)
    return code, out.getvalue(), err.getvalue()


AB_BUILDS = ["--build", f"{RKV}={RKV_GRAPH_BYTES}", "--build", f"{QFOLD}={QFOLD_GRAPH_BYTES}"]


def test_cli_json_reproduces_the_writeup() -> None:
    code, out, err = run_cli([str(EXAMPLE), *AB_BUILDS, "--bw", "55900000000", "--json"])
    assert code == 0, err
    payload = json.loads(out)
    assert set(payload) >= {"builds", "fits", "ab", "issues", "bandwidth", "files", "unmapped_builds"}
    (ab,) = payload["ab"]
    assert (ab["build_a"], ab["build_b"], ab["graph_diff_bytes"]) == (RKV, QFOLD, TILE_BYTES)
    assert ab["gap_pct"] == pytest.approx(-14.96, abs=0.005)
    row = next(b for b in payload["builds"] if b["label"] == QFOLD)
    assert set(row) >= {"label", "device", "n", "measured_mean_tok_per_s", "predicted_tok_per_s",
                        "inferred_bytes_per_token", "graph_bytes_per_token", "gap_bytes", "gap_pct"}
    assert row["inferred_bytes_per_token"] == 1_029_465_930 and row["n"] == 1
    assert {b["kind"] for b in payload["bandwidth"]} == {"fixed"}
    (fit,) = payload["fits"]
    assert fit["device"] == AB_DEVICE and fit["model"] == "bandwidth" and fit["verdict"]
    assert payload["issues"] == [] and sorted(payload["unmapped_builds"]) == [
        "exaone-base-device-table", "exaone-top8-device-table"]


def test_cli_without_bw_uses_the_fit_where_it_exists_and_says_so() -> None:
    code, out, _ = run_cli([str(EXAMPLE), *AB_BUILDS, "--json"])
    assert code == 0
    chosen = {b["device"]: b for b in json.loads(out)["bandwidth"]}
    assert chosen[AB_DEVICE]["kind"] == "fit" and "fitted on" in chosen[AB_DEVICE]["source"]
    assert chosen["iPhone 16 Pro"]["kind"] == "preset"
    assert chosen["iPhone 16 Pro"]["bytes_per_s"] == 55_900e6


def test_cli_text_output_and_row_issues(tmp_path: Path) -> None:
    log = tmp_path / "runs.csv"
    log.write_text("device,build,tok_per_s\nd,a,50\nd,b,25\nd,b,26\nd,b,\"31,2\"\n", encoding="utf-8")
    code, out, err = run_cli([str(log), "--build", "a=1000000000", "--build", "b=2000000000", "--overhead"])
    assert code == 0
    assert "Builds:" in out and "Fits per device:" in out and "A/B pairs" in out
    assert "MB = 10^6 bytes" in out and "d [bandwidth+overhead]" in out
    assert f"{log}:5, column 'tok_per_s'" in err and "decimal commas" in err


def test_cli_build_paths_read_the_analysis_and_state_its_assumptions(tmp_path: Path) -> None:
    rkv, qfold = (SHIPPED_DIR / shipped_name("exaone-4.0-1.2b", v, "state", 4096, "top8")
                  for v in ("repeat_kv", "qfold"))
    code, out, err = run_cli([str(EXAMPLE), "--build", f"{RKV}={rkv}", "--build", f"{QFOLD}={qfold}",
                              "--bw", "5.59e10", "--json"])
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ab"][0]["graph_diff_bytes"] == TILE_BYTES  # top8 on both sides: only the replication differs
    sources = {g["label"]: g for g in doc["graph_sources"]}
    assert sources[RKV]["path"] == str(rkv) and sources[RKV]["bytes_per_token"] == 3_174_671_528
    notes = " ".join(sources[QFOLD]["assumptions"])
    assert "attention int8 in layers 0-3,26-29; pal4 in layers 4-25" in notes
    assert "the write-up does not state it" in notes and "charged as stored" in notes
    code, text, _ = run_cli([str(EXAMPLE), "--build", f"{RKV}={rkv}", "--build", f"{QFOLD}=1161405608"])
    assert code == 0 and f"graph bytes of {QFOLD}: 1,161,405,608 (given as a number)" in text

    broken = tmp_path / "broken.analysis.json"
    broken.write_text('{"schema_version": 2, "program": []}')
    code, _, err = run_cli([str(EXAMPLE), "--build", f"{RKV}={broken}"])
    assert code == 2 and f"{broken}: field program: expected an object, got a list" in err and "Traceback" not in err
    code, _, err = run_cli([str(EXAMPLE), "--build", f"{RKV}={tmp_path / 'no-build'}"])
    assert code == 2 and "not an .mlpackage nor a build folder" in err


def test_the_cli_and_the_page_run_one_pipeline() -> None:
    """``fit`` and the Bandwidth page both call device.fit.bandwidth_report (app_pages/logs_state.py)."""
    measurements = parse_log(EXAMPLE.read_bytes(), EXAMPLE.name).measurements
    result = bandwidth_report(measurements, {RKV: RKV_GRAPH_BYTES, QFOLD: QFOLD_GRAPH_BYTES})
    assert [p.graph_diff_bytes for p in result.crosscheck.pairs] == [TILE_BYTES]
    assert result.bandwidth[AB_DEVICE].kind == "fit" and result.bandwidth["iPhone 16 Pro"].kind == "preset"
    page_state = (REPO / "app_pages" / "logs_state.py").read_text()
    assert "bandwidth_report(" in page_state and "fit_devices(" not in page_state
    assert "bandwidth_report(" in (REPO / "analyzer" / "cli" / "fit.py").read_text()


def test_cli_rejected_file_exits_1_with_messages(tmp_path: Path) -> None:
    bad = tmp_path / "utf16.csv"
    bad.write_bytes("device,build,tok_per_s\nd,a,1\n".encode("utf-16"))
    code, out, err = run_cli([str(EXAMPLE), str(bad), "--json"])
    assert code == 1 and out == ""
    assert f"error: {bad}: file is UTF-16" in err and "Traceback" not in err
    none_ok = tmp_path / "none.csv"
    none_ok.write_text("device,build,tok_per_s\nd,a,0\n")
    code, _, err = run_cli([str(none_ok)])
    assert code == 1 and "no row was accepted" in err and f"{none_ok}:2, column 'tok_per_s'" in err


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--build", "nolabel"], "expected LABEL=BUILD_PATH or LABEL=BYTES_PER_TOKEN"),
        (["--build", "a=1", "--build", "a=2"], "label 'a' is given twice"),
        (["--build", "a=0"], "bytes/token must be > 0"),
        (["--build", "a=2.0e9"], "whole number of bytes"),
        (["--build", "a=1_000"], "whole number of bytes"),
    ],
)
def test_cli_bad_build_arguments_exit_2(argv: list[str], fragment: str) -> None:
    code, out, err = run_cli([str(EXAMPLE), *argv])
    assert code == 2 and out == "" and fragment in err and "Traceback" not in err


def test_cli_missing_log_exits_2(tmp_path: Path) -> None:
    code, _, err = run_cli([str(tmp_path / "nope.csv")])
    assert code == 2 and "cannot read" in err


@pytest.mark.parametrize(("bw", "fragment"), [("55,900", "decimal commas"), ("55.9GB/s", "units"),
                                              ("0", "> 0"), ("-5e10", "> 0")])
def test_cli_bad_bw_is_an_argparse_error(bw: str, fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        run_cli([str(EXAMPLE), f"--bw={bw}"])
    assert excinfo.value.code == 2 and fragment in capsys.readouterr().err


def test_cli_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "analyzer", "fit", str(EXAMPLE), *AB_BUILDS, "--bw", "55900000000", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ab"][0]["gap_pct"] == pytest.approx(-14.96, abs=0.005)
