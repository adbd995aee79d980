"""The roof check: every decode row of a known build on a device with a cited bandwidth against BW ÷ the bytes its
build must read per token. A real llama-bench row (the llama.cpp README's tg128) labelled with the wrong build (the
shipped full-size EXAONE analysis) is above its roof and left out of the fit; a row 50× under its roof is
far_below_roof; each flag names the roof, bytes and bandwidth it used. No conversion: shipped analyses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.analysis.record import load_analysis
from analyzer.cli import main
from analyzer.measure.logs import parse_log
from analyzer.predict.profiles import load_profiles
from analyzer.predict.roof_check import BuildBytes, check_rows, chip_of, pick_profile, without_impossible

REPO = Path(__file__).resolve().parent.parent
LLAMA_BENCH = REPO / "tests" / "data" / "logs" / "llama_bench_readme.md"
EXAONE = REPO / "analyzer" / "shipped" / "exaone-4.0-1.2b-qfold-state-ctx4096.analysis.json"
WRONG = "qwen2 1.5B Q4_0"  # the row's own label (llama-bench's model_type), mapped to EXAONE's graph: wrong


@pytest.fixture(scope="module")
def exaone():
    return BuildBytes.of_analysis("exaone", load_analysis(EXAONE))


def fit_json(capsys, *args: str) -> dict:
    assert main(["fit", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_real_llama_bench_row_labelled_with_the_wrong_build_is_above_its_roof_and_left_out(capsys, exaone):
    doc = fit_json(capsys, str(LLAMA_BENCH), "--device", "Apple M1 Max", "--build", f"{WRONG}={EXAONE}")
    prefill, decode = doc["rows"]
    assert (prefill["phase"], prefill["roof_tok_per_s"], prefill["flags"]) == ("prefill", None, [])
    weights, kv = exaone.weights_bytes, exaone.kv_read_bytes
    roof_bytes = weights + kv * 128 // 4096  # tg128 from an empty cache: context 128 of the build's 4096
    assert (decode["line"], decode["device"], decode["build"], decode["context_length"], decode["tok_per_s"]) == (
        4, "Apple M1 Max", WRONG, 128, 197.71)
    assert (decode["roof_bytes_per_token"], decode["roof_bw_bytes_per_s"], decode["roof_profile"]) == (
        roof_bytes, 400_000_000_000, "m1-max-soc")  # Metal,BLAS reads the SoC's memory: its datasheet 400 GB/s
    assert decode["roof_tok_per_s"] == pytest.approx(400e9 / roof_bytes) and decode["roof_tok_per_s"] < 197.71
    assert decode["flags"] == ["above_roof"] and doc["left_out_above_roof"] == 1
    assert doc["builds"] == [] and doc["fits"] == []  # the impossible row is not fitted
    kept = fit_json(capsys, str(LLAMA_BENCH), "--device", "Apple M1 Max", "--build", f"{WRONG}={EXAONE}",
                    "--keep-impossible")
    assert kept["left_out_above_roof"] == 0 and [b["label"] for b in kept["builds"]] == [WRONG]
    assert kept["rows"][1]["flags"] == ["above_roof"]  # still flagged, only fitted


def test_the_text_output_names_the_roof_the_bytes_and_the_bandwidth(capsys):
    assert main(["fit", str(LLAMA_BENCH), "--device", "Apple M1 Max", "--build", f"{WRONG}={EXAONE}"]) == 0
    out = capsys.readouterr().out
    assert "above_roof: 197.71 tok/s > roof 155.85 tok/s; roof = 400.00 GB/s (m1-max-soc) ÷ 2,566,651,456" in out
    assert "1 row(s) above their roof left out of the fit" in out


def test_a_row_fifty_times_below_its_roof_is_far_below_roof(exaone, tmp_path, capsys):
    profiles = load_profiles()
    roof = 400e9 / (exaone.weights_bytes + exaone.kv_read_bytes)  # at the build's own ctx: the whole KV read
    csv = ("device,build,tok_per_s,context_length,compute_units\n"
           f"Apple M1 Max,exaone,{roof / 50:.4f},4096,GPU\n"
           f"Apple M1 Max,exaone,{roof / 2:.4f},4096,GPU\n"
           f"Apple M1 Max,exaone,{roof / 2:.4f},4096,cpuAndNeuralEngine\n")
    rows = check_rows(parse_log(csv.encode(), "x.csv").measurements, {"exaone": exaone}, profiles)
    assert [r.flags for r in rows] == [("far_below_roof",), (), ("above_roof",)]  # the ANE's 54.62 GB/s is lower
    far, _, ane = rows
    assert far.roof_tok_per_s == pytest.approx(roof) and far.roof_profile == "m1-max-soc"
    assert far.describe_flags().startswith(f"far_below_roof: {roof / 50:,.2f} tok/s < roof ÷ 10 {roof / 10:,.2f}")
    assert ane.roof_profile == "m1-max-ane" and ane.roof_bw_bytes_per_s == 54_620_000_000
    path = tmp_path / "x.csv"
    path.write_text(csv)
    doc = fit_json(capsys, str(path), "--build", f"exaone={EXAONE}")
    assert [r["flags"] for r in doc["rows"]] == [["far_below_roof"], [], ["above_roof"]]
    assert doc["left_out_above_roof"] == 1 and doc["builds"][0]["n"] == 2  # far below is fitted, only flagged


def test_which_profile_a_row_uses_and_why_a_row_has_none(exaone):
    profiles = load_profiles()
    assert (chip_of("Mac16,7"), chip_of("Apple M4 Pro (Mac mini 24 GB)"), chip_of("NVIDIA A100"),
            chip_of("iPhone18,1")) == ("M4 Pro", "M4 Pro", None, "A19 Pro")
    best, how = pick_profile("Mac16,7", None, profiles)  # the community blob's device: no compute units
    assert best.key == "m4-pro-soc" and "highest" in how
    assert pick_profile("Apple M4 Pro", "CPU_AND_NE", profiles)[0].key == "m4-pro-ane"
    assert pick_profile("iPhone18,1", None, profiles) == (None, "no cited bandwidth for A19 Pro")
    csv = ("device,build,tok_per_s,phase\nRTX 4080,exaone,10,decode\nApple M1 Max,other,10,decode\n"
           "Apple M1 Max,exaone,10,prefill\n")
    rows = check_rows(parse_log(csv.encode(), "x.csv").measurements, {"exaone": exaone}, profiles)
    assert all(r.roof_tok_per_s is None and r.flags == () for r in rows)
    assert ["names no Apple chip" in rows[0].why, "'other' is not known" in rows[1].why,
            "a prefill run" in rows[2].why] == [True, True, True]


def test_a_build_given_as_a_number_is_its_own_roof_bytes_and_context_unknown_reads_the_whole_cache(exaone):
    csv = "device,build,tok_per_s\nApple M4,n,100\nApple M4,exaone,10\n"
    measurements = parse_log(csv.encode(), "x.csv").measurements
    given = BuildBytes("n", None, None, None, 2 * 10**9, "given")
    rows = check_rows(measurements, {"n": given, "exaone": exaone}, load_profiles())
    assert rows[0].roof_bytes_per_token == 2 * 10**9 and rows[0].roof_profile == "m4-soc"  # 120 GB/s > ANE 64
    assert rows[0].roof_tok_per_s == pytest.approx(60.0) and rows[0].flags == ("above_roof",)
    assert rows[1].roof_bytes_per_token == exaone.weights_bytes + exaone.kv_read_bytes
    kept, left_out = without_impossible(measurements, rows)
    assert left_out == 1 and [m.build for m in kept] == ["exaone"]
