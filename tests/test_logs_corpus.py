"""The malformed-log corpus (tests/data/logs/malformed/, files on disk) through the real CLI, as a subprocess.

Issue #11's bar: every case gives the right exit code and no traceback, every error names its file (and its
line where the file has one), and partly bad files keep exactly their good records. To stay fast the corpus
runs in three ``python -m analyzer fit`` processes, not one per file: every file rejected whole in one
(exit 1, one stderr line per file), every partly bad file in one ``--json`` run (exit 0, per-file counts and
issues from the payload), and the one accepted file without a single good record alone (exit 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path("tests/data/logs/malformed")  # relative: the CLI labels each file by the path it was given


@dataclass(frozen=True)
class Expect:
    """``accepted`` = -1: the file is rejected whole with one error; else exact record counts.
    ``errors``: (line or None, fragment of the message) of every error, in order."""

    file: str
    accepted: int
    errors: tuple[tuple[int | None, str], ...]
    rejected: int = 0
    skipped: int = 0
    record: int | None = None
    duplicate_of: str | None = None


REJECTED = [
    Expect("empty.csv", -1, ((None, "file is empty (0 bytes)"),)),
    Expect("whitespace_only.txt", -1, ((None, "only whitespace"),)),
    Expect("utf16_bom.csv", -1, ((None, "UTF-16 (little-endian)"),)),
    Expect("utf16_no_bom.csv", -1, ((1, "looks like UTF-16 without a byte-order mark"),)),
    Expect("utf32_bom.csv", -1, ((None, "UTF-32 (little-endian)"),)),
    Expect("latin1.csv", -1, ((3, "not valid UTF-8 at byte offset 65"),)),
    Expect("nul_byte.csv", -1, ((3, "NUL byte"),)),
    Expect("control_char.csv", -1, ((3, "control character U+0007"),)),
    Expect("png_header.log", -1, ((1, "not valid UTF-8 at byte offset 0 (byte 0x89)"),)),
    Expect("header_only.csv", -1, ((1, "header but no data rows"),)),
    Expect("every_row_ragged.csv", -1, ((2, "every data row has 4 fields but the header has 3"),)),
    Expect("duplicate_columns.csv", -1, ((1, "duplicate column name (columns 2 and 3)"),)),
    Expect("missing_tok_per_s.csv", -1, ((1, "missing required column(s) tok_per_s"),)),
    Expect("semicolons.csv", -1, ((1, "semicolon-separated files are not accepted"),)),
    Expect("empty_header_name.csv", -1, ((1, "header column 4 has no name"),)),
    Expect("malformed_quote.csv", -1, ((3, "malformed CSV"),)),
    Expect("unterminated_quote.csv", -1, ((3, "malformed CSV"),)),
    Expect("json_own_schema.json", -1, ((None, "accepted only as llama-bench output"),)),
    Expect("json_invalid.json", -1, ((3, "invalid JSON"),)),
    Expect("json_deep_nesting.json", -1, ((None, "nested too deeply"),)),
    Expect("json_empty_array.json", -1, ((None, "JSON array is empty"),)),
    Expect("json_multiline_object.json", -1, ((None, "a JSON object spanning several lines"),)),
    Expect("json_trailing_text.json", -1, ((1, "text after the closing ']'"),)),
    Expect("sql_without_avg_ts.sql", -1, ((None, "llama-bench output without field(s) avg_ts"),)),
    Expect("markdown_no_usable_table.md", -1, ((None, "no markdown table with llama-bench's test and t/s"),)),
    Expect("markdown_header_only.md", -1, ((1, "header but no data rows"),)),
    Expect("two_runners_in_one_file.txt", -1, ((None, "lines of several runners in one file"),)),
    Expect("prose.txt", -1, ((1, "missing required column(s) tok_per_s"),)),
    Expect("too_many_columns.csv", -1, ((1, "101 columns, over the limit of 64"),)),
    Expect("field_too_long.csv", -1, ((2, "5,000 characters, over the limit of 4,096"),)),
    Expect("only_quoted_empty_lines.csv", -1, ((None, "no header row"),)),
    # Published examples that do not parse: llama-bench README CSV examples with one value too many/few.
    Expect("llama_bench_readme_2023.csv", -1, ((2, "every data row has 27 fields but the header has 26"),)),
    Expect("llama_bench_readme_ragged.csv", -1, ((2, "every data row has 41 fields but the header has 42"),)),
]

RANGE = "outside the accepted range 0.001 to 1,000,000 tok/s"
PARTIAL = [
    Expect("tok_nan.csv", 1, ((3, "NaN is not a measurement"),), rejected=1),
    Expect("tok_inf.csv", 1, ((3, "tok_per_s must be finite"),), rejected=1),
    Expect("tok_negative.csv", 1, ((3, "must be > 0"),), rejected=1),
    Expect("tok_zero.csv", 1, ((3, "must be > 0"),), rejected=1),
    Expect("tok_tiny_1e-300.csv", 1, ((3, RANGE),), rejected=1),
    Expect("tok_huge_1e300.csv", 1, ((3, RANGE),), rejected=1),
    Expect("decimal_comma.csv", 1, ((3, "decimal commas"),), rejected=1),
    Expect("units_in_cell.csv", 1, ((3, "units are not accepted in the cell ('tok/s')"),), rejected=1),
    Expect("digit_separator.csv", 1, ((3, "digit separators"),), rejected=1),
    Expect("tok_missing.csv", 1, ((3, "missing: tok_per_s is required"),), rejected=1),
    Expect("tok_word.csv", 1, ((3, "not a number"),), rejected=1),
    Expect("ragged_row.csv", 3, ((3, "row has 2 fields but the header has 3"),), rejected=1),
    Expect("context_suffix_4k.csv", 1, ((3, "units or suffixes"),), rejected=1),
    Expect("context_negative.csv", 1, ((3, "context_length must be > 0"),), rejected=1),
    Expect("context_too_large.csv", 1, ((3, "over 16,777,216 tokens"),), rejected=1),
    Expect("prompt_tokens_fraction.csv", 1, ((3, "whole number of tokens"),), rejected=1),
    Expect("phase_unknown.csv", 1, ((3, "phase must be one of decode, prefill, mixed"),), rejected=1),
    Expect("empty_device.csv", 1, ((2, "device is empty"),), rejected=1),
    Expect("build_line_break.csv", 1, ((3, "line breaks are not allowed in build"),), rejected=1),
    Expect("zero_width_label.csv", 2, ()),
    Expect("bidi_label.csv", 2, ()),
    Expect("formula_cells.csv", 2, ()),
    Expect("llama_bench_csv_bad_avg_ts.csv", 1, ((3, "not a number"),), rejected=1),
    Expect("llama_bench_csv_bad_n_gen.csv", 1, ((3, "n_gen must be a non-negative integer"),), rejected=1),
    Expect("llama_bench_csv_no_device.csv", 1, ((3, "device is empty"),), rejected=1),
    Expect("llama_bench_minified_one_bad.json", 2, ((1, "NaN is not a measurement"),), rejected=1, record=2),
    Expect("llama_bench_jsonl_bad_line.jsonl", 2, ((2, "invalid JSON on this line"),), rejected=1),
    Expect("llama_bench_jsonl_bad_object.jsonl", 1, ((2, "n_gen must be a non-negative integer"),), rejected=1),
    Expect("llama_bench_jsonl_tok_1e300.jsonl", 1, ((2, RANGE),), rejected=1),
    Expect("llama_bench_sql_unterminated.sql", 1, ((2, "malformed VALUES"),), rejected=1),
    Expect("llama_bench_sql_stray_lines.sql", 2, ()),
    Expect("llama_bench_sql_bad_insert.sql", 1, ((2, "malformed INSERT statement"),), rejected=1),
    Expect("markdown_decimal_comma.md", 1, ((4, "decimal commas"),), rejected=1),
    Expect("markdown_bad_test.md", 1, ((4, "not a llama-bench test"),), rejected=1),
    Expect("markdown_row_cut_short.md", 1, ((4, "table row without its closing '|'"),), rejected=1),
    Expect("markdown_ragged_row.md", 1, ((4, "row has 8 fields but the header has 7"),), rejected=1),
    Expect("markdown_tok_1e300.md", 1, ((4, RANGE),), rejected=1),
    Expect("markdown_qfold_schema.md", 1, ((4, "decimal commas"),), rejected=1),
    Expect("llama_cpp_edited_rate.txt", 1, ((3, "disagrees with 127 runs in 2226.4 ms"),), rejected=1),
    Expect("llama_cpp_zero_runs.txt", 1, (), skipped=1),
    Expect("llama_cpp_cut_short.txt", 1, ((2, "not a complete llama.cpp timing line"),), rejected=1),
    Expect("llama_cpp_rate_word.txt", 1, ((2, "not a number"),), rejected=1),
    Expect("mlx_bad_rate.txt", 1, ((2, "not a number"),), rejected=1),
    Expect("mlx_cut_short.txt", 1, ((2, "not a complete mlx_lm line"),), rejected=1),
    Expect("mlx_tok_tiny.txt", 1, ((2, RANGE),), rejected=1),
    Expect("executorch_cut_json.txt", 2, ((2, "PyTorchObserver is not followed by a JSON object"),), rejected=1),
    Expect("executorch_missing_field.txt", 2, ((2, "missing"),), rejected=1),
    Expect("executorch_time_reversed.txt", 2, ((2, "timestamps out of order"),), rejected=1),
    Expect("executorch_coreml_edited_rate.txt", 1, ((5, "disagrees with 100 tokens in 1.6 s"),), rejected=1),
    Expect("anemll_bad_inference.txt", 3, ((6, "not a number"),), rejected=1),
    Expect("duplicate_a.csv", 1, ()),
    Expect("duplicate_b.csv", 0, (), duplicate_of="duplicate_a.csv"),
]

# An accepted file without one good record: `fit` has nothing to fit and says so.
NOTHING_ACCEPTED = Expect("llama_bench_readme_2023.sql", 0, ((30, "INSERT has 27 values for 26 columns"),
                                                            (31, "INSERT has 27 values for 26 columns")), rejected=2)


def label(expect: Expect) -> str:
    return str(CORPUS / expect.file)


def run_fit(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "analyzer", "fit", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def test_every_corpus_file_has_an_expectation_and_there_are_at_least_sixty() -> None:
    on_disk = sorted(p.name for p in (REPO / CORPUS).iterdir())
    expected = sorted(e.file for e in [*REJECTED, *PARTIAL, NOTHING_ACCEPTED])
    assert on_disk == expected
    assert len(on_disk) >= 60
    assert len({(REPO / CORPUS / name).read_bytes() for name in on_disk}) == len(on_disk) - 1  # one duplicate pair


def test_files_rejected_whole_exit_1_with_one_line_per_file() -> None:
    result = run_fit(*(label(e) for e in REJECTED))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    for e in REJECTED:
        ((line, fragment),) = e.errors
        start = f"error: {label(e)}"
        mine = [text for text in lines if text.startswith((start + ":", start + ","))]
        assert len(mine) == 1, (e.file, mine)
        after = mine[0][len(start):]  # ":3, …" / ":3: …" with a line, ": …" / ", column …" without
        where = after.split(" ", 1)[0].strip(":,")
        assert where == ("" if line is None else str(line)), (e.file, mine[0])
        assert fragment in mine[0], (e.file, mine[0])
    assert lines[-1].startswith("qfold fit: error: log import failed (rejected: ")
    assert all(label(e) in lines[-1] for e in REJECTED)


@pytest.fixture(scope="module")
def partial_payload() -> dict:
    result = run_fit("--json", *(label(e) for e in PARTIAL))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr + result.stdout
    return json.loads(result.stdout)


@pytest.mark.parametrize("expect", PARTIAL, ids=[e.file for e in PARTIAL])
def test_partly_bad_files_keep_exactly_their_good_records(partial_payload: dict, expect: Expect) -> None:
    (report,) = [f for f in partial_payload["files"] if f["file_name"] == label(expect)]
    assert report["accepted"] is True
    assert (report["n_accepted"], report["n_rejected"], report["n_skipped"]) == (
        expect.accepted, expect.rejected, expect.skipped)
    assert report["duplicate_of"] == (None if expect.duplicate_of is None else str(CORPUS / expect.duplicate_of))
    errors = [i for i in partial_payload["issues"] if i["file_name"] == label(expect) and i["severity"] == "error"]
    assert [i["line"] for i in errors] == [line for line, _ in expect.errors]
    for issue, (_, fragment) in zip(errors, expect.errors, strict=True):
        assert fragment in issue["message"], issue
        assert issue["record"] == expect.record


def test_labels_are_normalised_so_invisible_characters_make_no_second_build(partial_payload: dict) -> None:
    builds = {b["label"] for b in partial_payload["builds"] if b["device"] == "iPhone 16 Pro"}
    assert "b1\u200b" not in builds and "\u202eb1" not in builds and "b1" in builds
    zero_width = [b for b in partial_payload["builds"] if b["label"] == "b1"]
    assert sum(b["n"] for b in zero_width) == 4  # b1 and b1\u200b (zero_width_label.csv) + bidi_label.csv's two


def test_an_accepted_file_without_one_good_record_exits_1_naming_each_line() -> None:
    result = run_fit(label(NOTHING_ACCEPTED))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    for line, fragment in NOTHING_ACCEPTED.errors:
        assert any(text.startswith(f"error: {label(NOTHING_ACCEPTED)}:{line}") and fragment in text
                   for text in result.stderr.splitlines()), result.stderr
    assert "no row was accepted" in result.stderr.splitlines()[-1]
