"""Every log format the importer reads, on fixtures copied from published output (or written from the tool's
format strings where none was found; tests/data/logs/SOURCES.md says which, line by line).

Each fixture is imported and checked to the exact tok/s, phase, context length, prompt tokens and line of
every row; a malformed variant of each (one line changed here, next to its verdict) keeps every other row and
refuses the changed one at its line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.fmt import to_csv
from analyzer.measure.logs import FORMATS, parse_log, parse_logs, summarize
from analyzer.predict.bandwidth_model import inferred_bytes_per_token, predicted_tok_per_s
from analyzer.predict.fit import FitPoint, fit_bandwidth

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "logs"
README_TABLE = REPO / "examples" / "llama_bench_readme.md"

# file → (format, [(line, phase, tok_per_s, context_length, prompt_tokens)])
FIXTURES: dict[str, tuple[str, list[tuple[int, str, float, int | None, int | None]]]] = {
    "llama_bench_readme.md": ("llama-bench-md", [(3, "prefill", 5765.41, 512, 512), (4, "decode", 197.71, 128, 0)]),
    "llama_bench_threads.md": ("llama-bench-md", [
        (3, "prefill", 6.17, 64, 64), (4, "decode", 4.05, 16, 0), (5, "prefill", 12.31, 64, 64),
        (6, "decode", 7.80, 16, 0), (7, "prefill", 23.18, 64, 64), (8, "decode", 12.22, 16, 0),
        (9, "prefill", 32.29, 64, 64), (10, "decode", 16.71, 16, 0), (11, "prefill", 33.52, 64, 64),
        (12, "decode", 15.32, 16, 0), (13, "prefill", 59.00, 64, 64), (14, "decode", 16.41, 16, 0)]),
    "llama_bench_depth.md": ("llama-bench-md", [
        (3, "prefill", 7340.20, 512, 512), (4, "decode", 120.60, 128, 0), (5, "prefill", 6425.91, 1024, 512),
        (6, "decode", 116.71, 640, 0)]),
    "llama_bench_d4096_pg.md": ("llama-bench-md", [
        (3, "prefill", 2210.50, 512, 512), (4, "decode", 131.25, 128, 0), (5, "mixed", 474.80, 640, 512),
        (6, "prefill", 980.30, 4608, 512), (7, "decode", 104.40, 4224, 0)]),
    "llama_bench_readme.json": ("llama-bench-json", [(2, "prefill", 7100.002165, 512, 512),
                                                     (48, "decode", 118.881588, 128, 0)]),
    "llama_bench_printed.csv": ("llama-bench-csv", [(2, "prefill", 7100.002165, 512, 512),
                                                    (3, "decode", 118.881588, 128, 0)]),
    "llama_bench_printed.jsonl": ("llama-bench-jsonl", [(1, "prefill", 7100.002165, 512, 512),
                                                        (2, "decode", 118.881588, 128, 0)]),
    "llama_bench_printed.sql": ("llama-bench-sql", [(46, "prefill", 7100.002165, 512, 512),
                                                    (47, "decode", 118.881588, 128, 0)]),
    "llama_cpp_print_timings.txt": ("llama-cpp-timings", [(3, "prefill", 43.05, 271, 271),
                                                          (4, "decode", 4.43, 271 + 510, 271)]),
    "llama_cpp_perf_context.txt": ("llama-cpp-timings", [(3, "prefill", 102.00, 9, 9), (4, "decode", 57.04, 136, 9)]),
    "llama_cpp_cli_and_server.txt": ("llama-cpp-timings", [
        (3, "prefill", 52.85, 49, 49), (4, "decode", 12.64, 49 + 178, 49),
        (14, "prefill", 55.73, 51, 51), (15, "decode", 11.94, 51 + 275, 51)]),
    "mlx_lm_generate.txt": ("mlx-lm-verbose", [(5, "prefill", 16.200, 7, 7), (6, "decode", 98.705, 7 + 20, 7)]),
    "executorch_llama_runner.txt": ("executorch-stats", [
        (1, "prefill", 31 / ((1736230917250 - 1736230917194) / 1000), 31, 31),
        (1, "decode", 96 / ((1736230919028 - 1736230917250) / 1000), 31 + 96, 31)]),
    "executorch_stats_only.txt": ("executorch-stats", [(4, "prefill", 553.571429, 31, 31),
                                                       (5, "decode", 53.993251, 31 + 96, 31)]),
    "executorch_coreml_static.txt": ("executorch-coreml-static", [(15, "decode", 62.50, 992 + 32, 6)]),
    "anemll_chat.txt": ("anemll-chat", [(14, "prefill", 182.6, None, None), (15, "decode", 47.2, 512, None),
                                        (21, "prefill", 196.7, None, None), (22, "decode", 46.8, 512, None)]),
    "coreml_llm_cli_sequoia.txt": ("coreml-llm-cli", [(2, "prefill", 704.52, None, 512),
                                                      (4, "decode", 1000 / 85.41, None, None)]),
    "coreml_llm_cli_main.txt": ("coreml-llm-cli", [(10, "decode", 1000 / 142.44, None, None)]),
}


def test_every_format_has_a_fixture() -> None:
    covered = {fmt for fmt, _ in FIXTURES.values()}
    # qfold's own schema: tests/test_logs.py; the Core AI benchmarks' JSON: tests/test_logs_coreai.py
    assert set(FORMATS) - covered == {"qfold-csv", "qfold-md", "coreai-llm-benchmark", "coreai-community-bench"}


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_rows_exactly(name: str) -> None:
    fmt, rows = FIXTURES[name]
    result = parse_log((DATA / name).read_bytes(), name)
    (report,) = result.files
    assert (report.format, report.accepted, report.n_records, report.n_accepted, report.n_rejected) == (
        fmt, True, len(rows), len(rows), 0)
    assert result.errors == ()
    got = [(m.line, m.phase, m.tok_per_s, m.context_length, m.prompt_tokens) for m in result.measurements]
    assert got == rows
    for m in result.measurements:  # every computed field says how it was computed
        derived = dict(m.derived)
        assert "phase" in derived
        assert (m.context_length is None) or "context_length" in derived
        assert m.notes  # which lines (runner) or which test (llama-bench) the row came from


def test_coreml_llm_cli_main_prints_no_prompt_token_count_so_no_prefill_row() -> None:
    """main's ``Prompt : 1,204.37 ms`` has no throughput line after it (only the sequoia branch prints one): a
    warning at that line says why there is no prefill row."""
    result = parse_log((DATA / "coreml_llm_cli_main.txt").read_bytes(), "main.txt")
    (warning,) = [w for w in result.warnings if w.line is not None]  # the others: no device, no build label
    assert (warning.line, warning.column, warning.severity) == (9, "Prompt", "warning")
    assert "without its token count" in warning.message and "no prefill row" in warning.message
    assert [m.phase for m in result.measurements] == ["decode"]


def test_readme_table_in_examples_is_the_fixture() -> None:
    assert README_TABLE.read_bytes() == (DATA / "llama_bench_readme.md").read_bytes()


def test_readme_block_pasted_verbatim_with_its_comment_prefix_reads_the_same() -> None:
    """llama.cpp's README prints the table inside a bash block, every line behind '    # '."""
    verbatim = "".join(f"    # {line}\n" if line else "    #\n" for line in README_TABLE.read_text().splitlines())
    fixture = parse_log(README_TABLE.read_bytes(), "t.md").measurements
    pasted = parse_log(verbatim.encode(), "t.md").measurements
    assert [(m.phase, m.tok_per_s, m.context_length, m.build) for m in pasted] == [
        (m.phase, m.tok_per_s, m.context_length, m.build) for m in fixture]
    assert ("build_commit", "3e0ba0e60") in pasted[1].extra and ("build_number", "4229") in pasted[1].extra


def test_llama_bench_markdown_maps_display_columns_and_keeps_the_rest() -> None:
    result = parse_log((DATA / "llama_bench_d4096_pg.md").read_bytes(), "bench.md")
    decode = result.measurements[4]
    assert (decode.build, decode.quantization, decode.compute_units) == (
        "exaone4 1.2B Q4_K - Medium", "exaone4 1.2B Q4_K - Medium", "Metal,BLAS")
    extra = dict(decode.extra)
    assert (extra["n_gpu_layers"], extra["n_ubatch"], extra["fa"], extra["stddev_ts"]) == ("99", "256", "1", "0.35")
    assert extra["size"] == "770.17 MiB" and extra["build_commit"] == "0000000"
    assert decode.notes == ("llama-bench tg128 @ d4096 ± 0.35 tok/s; build from model_type; n_gpu_layers 99; "
                            "llama.cpp 0000000")
    mixed = result.measurements[2]
    assert mixed.phase == "mixed" and dict(mixed.derived)["context_length"].startswith("n_depth + n_prompt + n_gen")


def test_the_five_llama_bench_formats_agree() -> None:
    """One run printed by every llama-bench printer reads as the same measurements."""
    names = ["llama_bench_readme.json", "llama_bench_printed.csv", "llama_bench_printed.jsonl",
             "llama_bench_printed.sql"]
    seen = []
    for name in names:
        result = parse_log((DATA / name).read_bytes(), name)
        seen.append([(m.device, m.build, m.phase, m.tok_per_s, m.context_length, m.prompt_tokens, m.date)
                     for m in result.measurements])
    assert all(rows == seen[0] for rows in seen)
    assert seen[0][1] == ("NVIDIA GeForce RTX 4080", "Qwen2.5-7B-Instruct-Q4_K_M.gguf", "decode", 118.881588, 128, 0,
                          "2025-04-24T11:58:51Z")


# ---------------------------------------------------------------------------------------------
# Malformed variants: (fixture, old text, new text, line refused, column, fragment)

VARIANTS = [
    ("llama_bench_readme.md", "197.71 ± 0.81", "197.71 tok/s", 4, "t/s", "units are not accepted"),
    ("llama_bench_threads.md", "| tg 16      |      7.80", "| tg sixteen |      7.80", 6, "test",
     "not a llama-bench test"),
    ("llama_bench_depth.md", "tg128 @ d512", "tg128 @ dfull", 6, "test", "not a llama-bench test"),
    ("llama_bench_d4096_pg.md", "104.40 ± 0.35", "-104.40 ± 0.35", 7, "t/s", "must be > 0"),
    ("llama_bench_readme.json", '"avg_ts": 118.881588', '"avg_ts": "NaN"', 48, "avg_ts", "NaN"),
    ("llama_bench_printed.csv", '"118.881588"', '"1e300"', 3, "avg_ts", "outside the accepted range"),
    ("llama_bench_printed.jsonl", '"n_gen": 128', '"n_gen": -128', 2, "n_gen", "non-negative integer"),
    ("llama_bench_printed.sql", "'118.881588'", "'118,881588'", 47, "avg_ts", "decimal commas"),
    ("llama_cpp_print_timings.txt", "4.43 tokens per second", "44.3 tokens per second", 4, "tokens per second",
     "disagrees"),
    ("llama_cpp_perf_context.txt", "2226.40 ms", "2226,40 ms", 4, "ms", "decimal commas"),
    ("llama_cpp_print_timings.txt", "510 runs", "510 runs,", 4, None, "not a complete llama.cpp timing line"),
    ("llama_cpp_cli_and_server.txt", "11.94 tokens per second", "inf tokens per second", 15, "tokens per second",
     "must be finite"),
    ("mlx_lm_generate.txt", "98.705 tokens-per-sec", "98.705 tps tokens-per-sec", 6, None,
     "not a complete mlx_lm line"),
    ("executorch_llama_runner.txt", '"generated_tokens":96', '"generated_tokens":-96', 1, "generated_tokens",
     "non-negative integer"),
    ("executorch_stats_only.txt", "Rate: \t53.993251", "Rate: \tfast", 5, "Rate", "not a number"),
    ("executorch_coreml_static.txt", "(62.50 tok/s)", "(6.25 tok/s)", 15, "tok/s", "disagrees"),
    ("anemll_chat.txt", "Inference: 46.8 t/s", "Inference: 4e7 t/s", 22, "t/s", "outside the accepted range"),
    ("coreml_llm_cli_sequoia.txt", "85.41 +/- 2.67", "85,41 +/- 2.67", 4, "ms / token", "decimal commas"),
    ("coreml_llm_cli_main.txt", "142.44 +/- 2.31 ms / token", "142.44 ms / token", 10, None,
     "not a complete coreml-llm-cli line"),
]


@pytest.mark.parametrize(("name", "old", "new", "line", "column", "fragment"), VARIANTS, ids=[v[0] for v in VARIANTS])
def test_malformed_variant_refuses_only_the_changed_line(name: str, old: str, new: str, line: int,
                                                         column: str | None, fragment: str) -> None:
    text = (DATA / name).read_text(encoding="utf-8")
    assert text.count(old) == 1
    good = parse_log(text.encode(), name)
    bad = parse_log(text.replace(old, new).encode(), name)
    (report,) = bad.files
    assert report.accepted and report.format == FIXTURES[name][0]
    (error,) = bad.errors
    assert (error.line, error.column) == (line, column) and fragment in error.message, error.describe()
    assert error.describe().startswith(f"error: {name}:{line}")
    lost = {m.line for m in good.measurements} - {m.line for m in bad.measurements}
    assert lost == {line}  # every other row kept, nothing shifted
    kept = [(m.line, m.phase, m.tok_per_s) for m in bad.measurements]
    assert kept == [(m.line, m.phase, m.tok_per_s) for m in good.measurements if m.line != line]


# ---------------------------------------------------------------------------------------------
# Labels, duplicates, detection by content


def test_labels_fill_rows_that_lack_them_and_the_file_name_stands_in_otherwise() -> None:
    data = (DATA / "mlx_lm_generate.txt").read_bytes()
    bare = parse_log(data, "m.txt")
    assert {(m.device, m.build) for m in bare.measurements} == {("m.txt", "m.txt")}
    warned = {i.column for i in bare.warnings if "stands in" in i.message}
    assert warned == {"device", "build"}
    labelled = parse_log(data, "m.txt", device="MacBook Pro M3 Max", build=" qwen-0.5b\u200b ")
    assert {(m.device, m.build) for m in labelled.measurements} == {("MacBook Pro M3 Max", "qwen-0.5b")}
    assert labelled.warnings == ()
    assert dict(labelled.measurements[0].derived)["device"] == "the device label given for rows without one"
    # A format that names its device keeps it; the label fills only rows without one.
    bench = parse_log((DATA / "llama_bench_printed.csv").read_bytes(), "b.csv", device="ignored")
    assert {m.device for m in bench.measurements} == {"NVIDIA GeForce RTX 4080"}
    with pytest.raises(ValueError, match="empty"):
        parse_log(data, "m.txt", device="\u200b")


def test_the_same_file_twice_is_counted_once() -> None:
    data = (DATA / "llama_bench_readme.md").read_bytes()
    result = parse_logs([("bench.md", data), ("copy of bench.md", data), ("bench.md", data)])
    assert len(result.measurements) == 2
    first, copy, again = result.files
    assert (copy.duplicate_of, again.duplicate_of, copy.n_records) == ("bench.md", "bench.md", 0)
    assert copy.sha256 == first.sha256 != ""
    assert any("same content as 'bench.md'" in i.message for i in result.warnings)


@pytest.mark.parametrize("name", FIXTURES)
def test_detection_ignores_the_file_name(name: str) -> None:
    result = parse_log((DATA / name).read_bytes(), "renamed.csv")
    assert result.files[0].format == FIXTURES[name][0]


def test_warned_formula_cells_are_exactly_the_cells_the_csv_export_escapes() -> None:
    data = (b"device,build,tok_per_s,notes,thermal\n"
            b'=HYPERLINK("x"),+qfold,54.3, @SUM(A1),-1\n'
            b"iPhone,qfold,20,\tcmd,|pipe\n")
    result = parse_log(data, "f.csv")
    warned = {(i.line, i.column): i.value for i in result.warnings if "formula-like" in i.message}
    assert warned == {(2, "device"): '=HYPERLINK("x")', (2, "build"): "+qfold", (2, "notes"): "@SUM(A1)",
                      (3, "thermal"): "|pipe"}
    frame = result.measurements_frame()
    exported = to_csv(frame.astype(object).where(frame.notna(), None).to_dict("records"), list(frame.columns))
    for value in warned.values():
        assert f"'{value}" in exported or f"\"'{value}" in exported.replace('""', '"')
    assert "'cmd" not in exported  # stored stripped as "cmd": nothing to escape, nothing warned


# ---------------------------------------------------------------------------------------------
# Ranges hold in the bandwidth model too (issue #11)


@pytest.mark.parametrize("tok", [1e-300, 1e300, 0.0, float("inf")])
def test_the_bandwidth_model_refuses_out_of_range_throughput(tok: float) -> None:
    with pytest.raises(ValueError, match="tok_per_s"):
        inferred_bytes_per_token(55.9e9, tok)
    with pytest.raises(ValueError, match="tok_per_s"):
        fit_bandwidth("d", [FitPoint("a", 10**9, tok), FitPoint("b", 2 * 10**9, 20.0)])


@pytest.mark.parametrize("bw", [1e-300, 1e308])
def test_the_bandwidth_model_refuses_out_of_range_bandwidth(bw: float) -> None:
    with pytest.raises(ValueError, match="outside the accepted range"):
        predicted_tok_per_s(bw, 10**9)


def test_a_fit_with_an_absurd_bandwidth_is_not_usable() -> None:
    fit = fit_bandwidth("d", [FitPoint("a", 10**18, 50.0), FitPoint("b", 2 * 10**18, 25.0)])
    assert fit.bw_bytes_per_s > 1e16 and not fit.physical and not fit.usable
    assert "outside" in fit.verdict


# ---------------------------------------------------------------------------------------------
# The Done-when case: `fit` of llama.cpp's README table, as a subprocess


def test_fit_of_the_readme_table_gives_its_tg_rate_as_a_decode_run() -> None:
    result = subprocess.run([sys.executable, "-m", "analyzer", "fit", str(README_TABLE.relative_to(REPO)), "--device",
                             "Apple M-series (README)", "--json"], cwd=REPO, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert [i for i in payload["issues"] if i["severity"] == "error"] == []
    (build,) = payload["builds"]  # the pp512 row is a prefill run: listed, never fitted
    assert (build["label"], build["device"], build["n"], build["measured_mean_tok_per_s"]) == (
        "qwen2 1.5B Q4_0", "Apple M-series (README)", 1, 197.71)
    (report,) = payload["files"]
    assert (report["format"], report["n_accepted"]) == ("llama-bench-md", 2)
    assert any(d.startswith("phase: from the llama-bench test") for d in report["derived"])


def test_summary_of_a_depth_sweep_keeps_each_context_apart() -> None:
    result = parse_log((DATA / "llama_bench_depth.md").read_bytes(), "depth.md", device="RTX")
    decode = summarize(result.measurements)
    assert [(s.context_length, s.mean_tok_per_s) for s in decode] == [(128, 120.60), (640, 116.71)]
