"""Device-log import: every malformed file is rejected or accepted on purpose, with its line and column.

Malformed files are generated here (not fixtures) so each case shows its bytes next to its verdict.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from analyzer.measure.logs import (
    LogImport,
    LogLimits,
    LogValidationError,
    Measurement,
    parse_decimal,
    parse_log,
    parse_logs,
    summarize,
)
from analyzer.measure.logs.validate import DEFAULT_PHASE_NOTE

REPO = Path(__file__).resolve().parent.parent
HEADER = "device,build,tok_per_s\n"
GOOD = "iPhone 16 Pro,qfold,54.3\n"
NOTES_HEADER = "device,build,tok_per_s,notes\n"


def issue_keys(result: LogImport, severity: str) -> set[tuple[int | None, str | None]]:
    return {(i.line, i.column) for i in result.issues if i.severity == severity}


def find(result: LogImport, severity: str, line: int | None, column: str | None, fragment: str) -> None:
    """Assert an issue with exactly this line and column whose message contains ``fragment``."""
    matches = [i for i in result.issues if (i.severity, i.line, i.column) == (severity, line, column)]
    got = [i.describe() for i in result.issues]
    assert matches, f"no {severity} at line {line}, column {column!r}; got {got}"
    assert any(fragment in i.message for i in matches), [i.describe() for i in matches]


@dataclass(frozen=True)
class Case:
    id: str
    data: bytes
    accepted: int  # rows accepted; -1 = file rejected whole
    errors: tuple[tuple[int | None, str | None, str], ...] = ()
    warnings: tuple[tuple[int | None, str | None, str], ...] = ()
    limits: LogLimits = field(default_factory=LogLimits)


def csv_bytes(*lines: str) -> bytes:
    return "".join(lines).encode("utf-8")


CASES = [
    # --- encoding and bytes -------------------------------------------------------------------
    Case("empty", b"", -1, ((None, None, "empty (0 bytes)"),)),
    Case("whitespace-only", b"  \n\n \r\n", -1, ((None, None, "only whitespace"),)),
    Case("only-empty-quoted-lines", b'""\n""\n', -1, ((None, None, "no header row"),)),
    Case("bom-accepted", b"\xef\xbb\xbf" + csv_bytes(HEADER, GOOD), 1),
    Case("utf16-bom", (HEADER + GOOD).encode("utf-16"), -1, ((None, None, "UTF-16 (little-endian)"),)),
    Case("utf16-be-bom", (HEADER + GOOD).encode("utf-16-be").join([b"\xfe\xff", b""]), -1,
         ((None, None, "UTF-16 (big-endian)"),)),
    Case("utf16-no-bom", (HEADER + GOOD).encode("utf-16-le"), -1, ((1, None, "looks like UTF-16"),)),
    Case("utf32-bom", (HEADER + GOOD).encode("utf-32"), -1, ((None, None, "UTF-32"),)),
    Case("latin1", (HEADER + GOOD + "iPhone 16 Pro,café,3\n").encode("latin-1"), -1,
         ((3, None, "not valid UTF-8"),)),
    Case("nul-byte", csv_bytes(HEADER, GOOD) + b"iPhone,q\x00fold,1\n", -1, ((3, None, "NUL byte"),)),
    Case("binary-junk", b"\x89PNG\r\n\x1a\n" + random.Random(7).randbytes(400), -1,
         ((1, None, "not valid UTF-8"),)),
    Case("control-char", csv_bytes(HEADER, GOOD, "iPhone,\x07qfold,1\n"), -1,
         ((3, None, "control character U+0007"),)),
    Case("size-limit", csv_bytes(HEADER, GOOD * 10), -1, ((None, None, "over the limit of 100 bytes"),),
         limits=LogLimits(max_file_bytes=100)),
    # --- structure ----------------------------------------------------------------------------
    Case("header-only", csv_bytes(HEADER), -1, ((1, None, "no data rows"),)),
    Case("header-only-trailing-blank", csv_bytes(HEADER, "\n\n"), -1, ((1, None, "no data rows"),)),
    Case("ragged-short-row", csv_bytes(HEADER, GOOD, "iPhone,qfold\n", GOOD), 2,
         ((3, None, "2 fields but the header has 3"),)),
    Case("ragged-long-row", csv_bytes(HEADER, GOOD, GOOD, "iPhone,qfold,1,oops\n"), 2,
         ((4, None, "4 fields but the header has 3"),)),
    Case("extra-field-every-row", csv_bytes(HEADER, "iPhone,qfold,1,x\n", "iPhone,qfold,2,y\n"), -1,
         ((2, None, "every data row has 4 fields but the header has 3"),)),
    Case("duplicate-columns", csv_bytes("device,build,build,tok_per_s\n", "a,b,c,1\n"), -1,
         ((1, "build", "duplicate column name (columns 2 and 3)"),)),
    Case("duplicate-columns-case", csv_bytes("device,Device,build,tok_per_s\n", "a,b,c,1\n"), -1,
         ((1, "Device", "duplicate column name"),)),
    Case("missing-column", csv_bytes("device,build\n", "a,b\n"), -1,
         ((1, "tok_per_s", "missing required column(s) tok_per_s"),)),
    Case("semicolon-separated", csv_bytes("device;build;tok_per_s\n", "a;b;1\n"), -1,
         ((1, None, "semicolon-separated"),)),
    Case("empty-header-name", csv_bytes("device,build,tok_per_s,\n", "a,b,1,\n"), -1,
         ((1, None, "header column 4 has no name"),)),
    Case("too-many-columns", csv_bytes(",".join(f"c{i}" for i in range(20_000)) + "\n", "1\n"), -1,
         ((1, None, "20,000 columns, over the limit of 64"),)),
    Case("huge-field", csv_bytes("device,build,tok_per_s,notes\n", "a,b,1," + "x" * 5_000 + "\n"), -1,
         ((2, "notes", "5,000 characters, over the limit of 4,096"),)),
    Case("field-over-csv-module-limit", csv_bytes(HEADER, "a,b," + "9" * 200_000 + "\n"), -1,
         ((2, None, "longer than 131,072 characters"),)),
    Case("row-limit", csv_bytes(HEADER, GOOD * 6), -1, ((7, None, "more than 5 data rows"),),
         limits=LogLimits(max_rows=5)),
    Case("row-limit-exact", csv_bytes(HEADER, GOOD * 5), 5, limits=LogLimits(max_rows=5)),
    Case("malformed-quote", csv_bytes(HEADER, GOOD, 'iPhone,"qfold"x,1\n'), -1,
         ((3, None, "malformed CSV"),)),
    Case("unterminated-quote", csv_bytes(HEADER, GOOD, 'iPhone,"qfold,1\n', GOOD), -1,
         ((3, None, "malformed CSV"),)),
    Case("crlf-accepted", csv_bytes(HEADER.replace("\n", "\r\n"), GOOD.replace("\n", "\r\n") * 2), 2),
    Case("cr-only-accepted", csv_bytes(HEADER.replace("\n", "\r"), GOOD.replace("\n", "\r") * 2), 2),
    Case("trailing-blank-lines", csv_bytes(HEADER, GOOD, "\n\n\n"), 1),
    Case("interior-blank-line", csv_bytes(HEADER, GOOD, "\n", "iPhone,qfold,x\n"), 1,
         ((4, "tok_per_s", "not a number"),), ((3, None, "blank line ignored"),)),
    Case("quoted-comma", csv_bytes(NOTES_HEADER, 'iPhone,qfold,54.3,"fan on, 25 °C"\n'), 1),
    Case("quoted-newline-in-notes",
         csv_bytes(NOTES_HEADER, 'iPhone,qfold,54.3,"line one\nline two"\n', "iPhone,qfold,-2,\n"), 1,
         ((4, "tok_per_s", "must be > 0"),)),
    Case("quoted-newline-in-build", csv_bytes(HEADER, GOOD, 'iPhone,"q\nfold",1\n'), 1,
         ((3, "build", "line breaks are not allowed in build"),)),
    # --- cells ----------------------------------------------------------------------------------
    Case("nan", csv_bytes(HEADER, GOOD, "iPhone,qfold,NaN\n"), 1,
         ((3, "tok_per_s", "NaN is not a measurement"),)),
    Case("inf", csv_bytes(HEADER, GOOD, "iPhone,qfold,inf\n"), 1, ((3, "tok_per_s", "must be finite"),)),
    Case("negative", csv_bytes(HEADER, GOOD, "iPhone,qfold,-31.2\n"), 1, ((3, "tok_per_s", "must be > 0"),)),
    Case("zero", csv_bytes(HEADER, GOOD, "iPhone,qfold,0\n"), 1, ((3, "tok_per_s", "must be > 0"),)),
    Case("decimal-comma-quoted", csv_bytes(HEADER, GOOD, 'iPhone,qfold,"31,2"\n'), 1,
         ((3, "tok_per_s", "decimal commas"),)),
    Case("decimal-comma-unquoted", csv_bytes(HEADER, GOOD, "iPhone,qfold,31,2\n"), 1,
         ((3, None, "4 fields but the header has 3"),)),
    Case("units-in-cell", csv_bytes(HEADER, GOOD, "iPhone,qfold,31 tok/s\n"), 1,
         ((3, "tok_per_s", "units are not accepted in the cell ('tok/s')"),)),
    Case("digit-separator", csv_bytes(HEADER, GOOD, "iPhone,qfold,1_000\n"), 1,
         ((3, "tok_per_s", "digit separators"),)),
    Case("missing-tok", csv_bytes(HEADER, GOOD, "iPhone,qfold,\n"), 1, ((3, "tok_per_s", "missing"),)),
    Case("not-a-number", csv_bytes(HEADER, GOOD, "iPhone,qfold,fast\n"), 1,
         ((3, "tok_per_s", "not a number"),)),
    Case("non-ascii-digits", csv_bytes(HEADER, GOOD, "iPhone,qfold,٣١\n"), 1,
         ((3, "tok_per_s", "not a number"),)),
    Case("empty-device", csv_bytes(HEADER, "  ,qfold,3\n", GOOD), 1, ((2, "device", "device is empty"),)),
    Case("empty-build-and-bad-tok", csv_bytes(HEADER, "iPhone,,0\n"), 0,
         ((2, "build", "build is empty"), (2, "tok_per_s", "must be > 0"))),
    Case("padded-numbers-accepted",
         csv_bytes(" device , build ,tok_per_s \n", "  iPhone , qfold ,  54.3  \n"), 1),
    Case("header-case-insensitive", csv_bytes("Device,BUILD,Tok_Per_S\n", GOOD), 1),
    Case("context-length", csv_bytes(
        "device,build,tok_per_s,context_length\n", "a,b,1,4k\n", "a,b,1,4096.0\n", "a,b,1,0\n", "a,b,1,-5\n",
        "a,b,1,4096\n", "a,b,1,\n"), 2,
         ((2, "context_length", "units or suffixes"), (3, "context_length", "whole number"),
          (4, "context_length", "must be > 0"), (5, "context_length", "must be > 0"))),
    # " =cmd" is stored stripped ("=cmd") and flagged; "\tcmd" is stored as "cmd", which is harmless.
    Case("formula-cells-kept", csv_bytes(
        "device,build,tok_per_s,notes\n", '=HYPERLINK("http://x"),+qfold,54.3,@SUM(A1)\n',
        "iPhone,qfold,20,\tcmd\n", 'iPhone,qfold,21," =cmd"\n'), 3, (),
         ((2, "device", "formula-like"), (2, "build", "formula-like"), (2, "notes", "formula-like"),
          (4, "notes", "formula-like"))),
    Case("unknown-columns-kept", csv_bytes("device,build,tok_per_s,thermal,offset\n", "a,b,1,hot,-1\n"), 1,
         (), ((None, "thermal, offset", "unknown column(s) kept"),)),
    # --- JSON that is not llama-bench ---------------------------------------------------------------
    Case("json-object-multiline", b'{\n "device": "a"\n}\n', -1, ((None, None, "spanning several lines"),)),
    Case("json-own-schema", json.dumps([{"device": "a", "build": "b", "tok_per_s": 1}]).encode(), -1,
         ((None, None, "accepted only as llama-bench output"),)),
    Case("json-invalid", b'[\n {"n_prompt": 0,\n  "n_gen": }\n]', -1, ((3, None, "invalid JSON"),)),
    Case("json-deep-nesting", b"[" * 200_000 + b"]" * 200_000, -1, ((None, None, "nested too deeply"),)),
    Case("json-array-of-numbers", b"[1, 2, 3]", -1, ((None, None, "accepted only as llama-bench output"),)),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_malformed_and_edge_case_files(case: Case) -> None:
    result = parse_log(case.data, "log.csv", case.limits)
    report = result.files[0]
    if case.accepted < 0:
        assert not report.accepted and result.rejected_files == ("log.csv",)
        assert result.measurements == ()
        assert len(result.errors) == 1, [i.describe() for i in result.issues]
    else:
        assert report.accepted, [i.describe() for i in result.issues]
        assert len(result.measurements) == case.accepted == report.n_accepted
    for line, column, fragment in case.errors:
        find(result, "error", line, column, fragment)
    for line, column, fragment in case.warnings:
        find(result, "warning", line, column, fragment)
    # Nothing reported beyond what the case expects: over-reporting is a bug too.
    assert issue_keys(result, "error") == {(line, column) for line, column, _ in case.errors}
    assert issue_keys(result, "warning") == {(line, column) for line, column, _ in case.warnings}


def test_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30


def test_accepted_values_are_parsed_stripped_and_kept_verbatim() -> None:
    data = csv_bytes(
        "device,build,tok_per_s,notes,context_length,thermal\n",
        ' iPhone 16 Pro , qfold , 54.30 ,"fan on, 25 °C",4096,hot\n',
        '=1+1,qfold,20.39,,,\n',
    )
    result = parse_log(data, "runs.csv")
    first, second = result.measurements
    assert first == Measurement(
        file_name="runs.csv", line=2, device="iPhone 16 Pro", build="qfold", tok_per_s=54.30,
        notes="fan on, 25 °C", context_length=4096, extra=(("thermal", "hot"),),
        phase="decode", derived=(("phase", DEFAULT_PHASE_NOTE),),
    )
    assert second.device == "=1+1" and second.line == 3  # formula text kept as text, never evaluated
    assert second.context_length is None and second.notes is None


def test_no_row_is_shifted_around_a_ragged_row() -> None:
    """A ragged row in the middle must not move any value into a neighbour's column."""
    rows = [f"dev{i},build{i},{i + 1}.5" for i in range(10)]
    rows[4] = "dev4,build4,5.5,EXTRA"
    result = parse_log(csv_bytes(HEADER, *(r + "\n" for r in rows)), "x.csv")
    assert [m.line for m in result.measurements] == [2, 3, 4, 5, 7, 8, 9, 10, 11]
    for m in result.measurements:
        i = m.line - 2
        assert (m.device, m.build, m.tok_per_s) == (f"dev{i}", f"build{i}", i + 1.5)
    find(result, "error", 6, None, "4 fields but the header has 3")


def test_long_values_are_truncated_to_80_characters_in_issues() -> None:
    value = "9" * 60 + " tokens per second, measured on a warm device"
    result = parse_log(csv_bytes(HEADER, f'a,b,"{value}"\n'), "x.csv")
    (issue,) = result.errors
    assert issue.value is not None and len(issue.value) == 80 and issue.value.endswith("…")
    assert issue.describe().startswith("error: x.csv:2, column 'tok_per_s', value '999")


def test_the_name_is_a_label_not_a_path(tmp_path: Path) -> None:
    secret = tmp_path / "secret.csv"
    secret.write_text(HEADER + "leak,leak,1\n")
    result = parse_log(csv_bytes(HEADER, GOOD), str(secret))
    assert [m.device for m in result.measurements] == ["iPhone 16 Pro"]  # data came from the bytes
    assert parse_log(csv_bytes(HEADER, GOOD), "evil\nname\x07.csv").files[0].file_name == "evil name.csv"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("31.2", 31.2), (" 2e3 ", 2000.0), ("-1", -1.0), (".5", 0.5), ("inf", math.inf)],
)
def test_parse_decimal_accepts_plain_numbers(text: str, expected: float) -> None:
    assert parse_decimal(text) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [("31,2", "decimal commas"), ("1,234.5", "decimal commas"), ("55.9 GB/s", "units are not accepted"),
     ("1_000", "digit separators"), ("nan", "NaN"), ("", "empty"), ("0x10", "units are not accepted")],
)
def test_parse_decimal_refuses_with_a_reason(text: str, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        parse_decimal(text)


# ---------------------------------------------------------------------------------------------
# llama-bench

LLAMA_FIELDS = (
    "build_commit,build_number,cpu_info,gpu_info,backends,model_filename,model_type,model_size,"
    "model_n_params,n_batch,n_ubatch,n_threads,cpu_mask,cpu_strict,poll,type_k,type_v,n_gpu_layers,"
    "split_mode,main_gpu,no_kv_offload,flash_attn,tensor_split,use_mmap,embeddings,n_prompt,n_gen,"
    "n_depth,test_time,avg_ns,stddev_ns,avg_ts,stddev_ts"
).split(",")


def llama_row(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "build_commit": "8cf427ff", "build_number": 5163, "cpu_info": "Apple M3 Max",
        "gpu_info": "Apple M3 Max", "backends": "Metal,BLAS",
        "model_filename": "models/EXAONE-4.0-1.2B-Q4_K_M.gguf", "model_type": "exaone4 1.2B Q4_K - Medium",
        "model_size": 812_000_000, "model_n_params": 1_279_000_000, "n_batch": 2048, "n_ubatch": 512,
        "n_threads": 12, "cpu_mask": "0x0", "cpu_strict": False, "poll": 50, "type_k": "f16",
        "type_v": "f16", "n_gpu_layers": 99, "split_mode": "layer", "main_gpu": 0, "no_kv_offload": False,
        "flash_attn": -1, "tensor_split": "0.00", "use_mmap": True, "embeddings": False, "n_prompt": 0,
        "n_gen": 128, "n_depth": 0, "test_time": "2025-04-24T11:57:10Z", "avg_ns": 1_067_431_600,
        "stddev_ns": 3_834_831, "avg_ts": 119.915244, "stddev_ts": 0.430617,
    }
    row.update(overrides)
    return row


def llama_csv(rows: list[dict[str, object]], fields: list[str] = LLAMA_FIELDS) -> bytes:
    def cell(v: object) -> str:
        return json.dumps(v) if isinstance(v, bool) else str(v)

    lines = [",".join(fields)] + [",".join(f'"{cell(r[f])}"' for f in fields) for r in rows]
    return ("\n".join(lines) + "\n").encode()


LLAMA_ROWS = [
    llama_row(n_prompt=512, n_gen=0, avg_ts=7285.68, test_time="2025-04-24T11:57:09Z"),  # pp: a prefill run
    llama_row(),  # tg128 on the GPU
    llama_row(n_gen=128, n_depth=512, avg_ts=101.5, stddev_ts=0.8),  # tg128 @ d512
    llama_row(n_prompt=512, n_gen=128, avg_ts=900.0),  # pp512+tg128: a mixed run
    llama_row(gpu_info="", backends="CPU", cpu_info="AMD Ryzen 7 7800X3D 8-Core Processor",
              n_gpu_layers=0, avg_ts=14.2, model_filename="C:\\models\\EXAONE-4.0-1.2B-Q8_0.gguf"),
]


def test_llama_bench_csv_keeps_every_phase_apart_and_derives_context() -> None:
    result = parse_log(llama_csv(LLAMA_ROWS), "bench.csv")
    report = result.files[0]
    assert (report.format, report.n_records, report.n_accepted, report.n_skipped, report.n_rejected) == (
        "llama-bench-csv", 5, 5, 0, 0)
    pp, gpu, deep, pg, cpu = result.measurements
    assert [m.phase for m in result.measurements] == ["prefill", "decode", "decode", "mixed", "decode"]
    assert (pp.tok_per_s, pp.prompt_tokens, pp.context_length) == (7285.68, 512, 512)
    assert (pg.tok_per_s, pg.prompt_tokens, pg.context_length) == (900.0, 512, 640)
    assert (gpu.line, gpu.device, gpu.build, gpu.tok_per_s) == (
        3, "Apple M3 Max", "EXAONE-4.0-1.2B-Q4_K_M.gguf", 119.915244)
    assert gpu.context_length == 128 and deep.context_length == 512 + 128 and gpu.prompt_tokens == 0
    derived = dict(deep.derived)
    assert derived["context_length"].startswith("n_depth + n_gen: the KV positions")
    assert derived["phase"].startswith("from the llama-bench test")
    assert gpu.quantization == "exaone4 1.2B Q4_K - Medium" and gpu.compute_units == "Metal,BLAS"
    assert gpu.date == "2025-04-24T11:57:10Z"
    assert gpu.notes is not None and "device from gpu_info" in gpu.notes and "tg128" in gpu.notes
    assert deep.notes is not None and "@ d512" in deep.notes
    assert (cpu.device, cpu.build) == ("AMD Ryzen 7 7800X3D 8-Core Processor", "EXAONE-4.0-1.2B-Q8_0.gguf")
    assert cpu.notes is not None and "device from cpu_info" in cpu.notes and "n_gpu_layers 0" in cpu.notes
    assert ("stddev_ts", "0.430617") in gpu.extra and ("n_threads", "12") in gpu.extra
    assert result.issues == ()
    # One line per rule, not per row: decode, prefill and mixed rows each derive context_length their way.
    assert [d.split(":")[0] for d in report.derived] == [
        "phase", "context_length", "prompt_tokens", "context_length", "context_length"]


def test_llama_bench_json_and_jsonl() -> None:
    objects = [
        {**llama_row(n_prompt=512, n_gen=0, avg_ts=7100.0), "samples_ts": [6863.1, 7147.55]},
        {**llama_row(), "samples_ns": [1075361300, 1065089400], "samples_ts": [119.03, 120.178]},
    ]
    as_json = json.dumps(objects, indent=2).encode()
    result = parse_log(as_json, "bench.json")
    assert result.files[0].format == "llama-bench-json"
    pp, m = result.measurements
    # Lines are where each object's "{" is in the file: line 1 is "[", the 2nd object follows the 1st.
    starts = [n for n, text in enumerate(as_json.decode().splitlines(), start=1) if text == "  {"]
    assert starts[0] == 2 == pp.line and pp.phase == "prefill"
    second_line = starts[1]
    assert m.line == second_line and m.tok_per_s == 119.915244 and m.device == "Apple M3 Max"
    assert ("samples_ts", "[119.03, 120.178]") in m.extra

    jsonl = "\n".join(json.dumps(o) for o in objects).encode() + b"\n"
    result = parse_log(jsonl, "bench.jsonl")
    assert result.files[0].format == "llama-bench-jsonl"
    assert [(m.line, m.phase) for m in result.measurements] == [(1, "prefill"), (2, "decode")]


def test_minified_json_array_rejects_only_the_bad_object() -> None:
    """Every object on line 1: the bad one (record 2) is named by record and refused alone (issue #11)."""
    objects = [llama_row(avg_ts=50.0), llama_row(avg_ts="nan"), llama_row(avg_ts=70.0, n_depth=1024)]
    result = parse_log(json.dumps(objects, separators=(",", ":")).encode(), "min.json")
    assert [(m.line, m.tok_per_s, m.context_length) for m in result.measurements] == [(1, 50.0, 128), (1, 70.0, 1152)]
    (error,) = result.errors
    assert (error.line, error.record, error.column) == (1, 2, "avg_ts")
    assert error.describe().startswith("error: min.json:1 (record 2), column 'avg_ts'")
    assert (result.files[0].n_accepted, result.files[0].n_rejected) == (2, 1)


def test_jsonl_with_one_bad_line_keeps_the_good_lines() -> None:
    lines = [json.dumps(llama_row(avg_ts=50.0)), '{"n_prompt": 0, "n_gen": 128, "avg_ts": ', json.dumps(llama_row())]
    result = parse_log(("\n".join(lines) + "\n").encode(), "bench.jsonl")
    assert [m.line for m in result.measurements] == [1, 3]
    find(result, "error", 2, None, "invalid JSON on this line")
    assert (result.files[0].n_records, result.files[0].n_rejected) == (3, 1)


@pytest.mark.parametrize(
    ("rows", "fields", "line", "column", "fragment"),
    [
        ([llama_row(avg_ts="nan")], LLAMA_FIELDS, 2, "avg_ts", "NaN"),
        ([llama_row(avg_ts=-3)], LLAMA_FIELDS, 2, "avg_ts", "must be > 0"),
        ([llama_row(n_gen="many")], LLAMA_FIELDS, 2, "n_gen", "non-negative integer"),
        ([llama_row(gpu_info="", cpu_info="")], LLAMA_FIELDS, 2, "gpu_info/cpu_info", "device is empty"),
        ([llama_row(n_gen=0, n_prompt=0)], LLAMA_FIELDS, 2, "n_gen", "measured no tokens"),
        ([llama_row(avg_ts=1e300)], LLAMA_FIELDS, 2, "avg_ts", "outside the accepted range"),
    ],
)
def test_llama_bench_bad_rows(rows: list[dict[str, object]], fields: list[str], line: int, column: str,
                              fragment: str) -> None:
    result = parse_log(llama_csv(rows, fields), "bench.csv")
    assert result.files[0].accepted and result.measurements == ()
    find(result, "error", line, column, fragment)


def test_llama_bench_csv_without_avg_ts_is_rejected_naming_the_field() -> None:
    fields = [f for f in LLAMA_FIELDS if f != "avg_ts"]
    result = parse_log(llama_csv([llama_row()], fields), "bench.csv")
    assert result.rejected_files == ("bench.csv",)
    find(result, "error", 1, "avg_ts", "llama-bench output without field(s) avg_ts")


# ---------------------------------------------------------------------------------------------
# Several files, records, frames, summaries


def test_parse_logs_merges_and_remembers_file_and_line() -> None:
    result = parse_logs([
        ("a.csv", csv_bytes(HEADER, GOOD, "iPhone 16 Pro,repeat_kv,20.4\n")),
        ("bad.csv", "x".encode("utf-16")),
        ("a.csv", csv_bytes(HEADER, "iPhone 17 Pro,qfold,56\n")),
        ("bench.csv", llama_csv(LLAMA_ROWS[:2])),
    ])
    assert [(m.file_name, m.line) for m in result.measurements] == [
        ("a.csv", 2), ("a.csv", 3), ("a.csv (2)", 2), ("bench.csv", 2), ("bench.csv", 3)]
    assert result.rejected_files == ("bad.csv",)
    find(result, "warning", None, None, "also named 'a.csv'")
    with pytest.raises(LogValidationError, match=r"bad\.csv.*UTF-16") as excinfo:
        result.raise_if_rejected()
    assert [i.file_name for i in excinfo.value.issues] == ["bad.csv"]
    parse_logs([("ok.csv", csv_bytes(HEADER, GOOD))]).raise_if_rejected()  # no error: nothing rejected


def test_frames() -> None:
    result = parse_log(csv_bytes("device,build,tok_per_s,context_length,thermal\n", "a,b,1.5,4096,hot\n",
                                 "a,b,2.5,,\n", "a,b,bad,,\n"), "x.csv")
    frame = result.measurements_frame()
    assert list(frame["line"]) == [2, 3] and frame["tok_per_s"].dtype == "float64"
    assert frame["context_length"].dtype == "Int64" and pd.isna(frame["context_length"].iloc[1])
    assert list(frame["thermal"]) == ["hot", ""]
    issues = result.issues_frame()
    assert list(issues.columns) == ["file_name", "line", "column", "value", "severity", "message", "record"]
    assert issues["line"].dtype == "Int64"
    assert set(zip(issues["line"].astype("object").where(issues["line"].notna(), None), issues["column"],
                   strict=True)) == {(None, "thermal"), (4, "tok_per_s")}
    shadowing = parse_log(csv_bytes("device,build,tok_per_s,line,file_name\n", "a,b,1,x,y\n"), "s.csv")
    frame = shadowing.measurements_frame()
    assert list(frame["line"]) == [2] and list(frame["extra:line"]) == ["x"]
    assert list(frame["file_name"]) == ["s.csv"] and list(frame["extra:file_name"]) == ["y"]
    empty = parse_log(b"", "e.csv")
    assert empty.measurements_frame().empty and len(empty.issues_frame()) == 1


def test_summarize_averages_time_per_token_and_uses_sample_std() -> None:
    values = [54.1, 54.3, 54.9, 53.8]
    rows = "".join(f"iPhone,qfold,{v}\n" for v in values) + "iPhone,repeat_kv,20.39\nPixel,qfold,30\n"
    result = parse_log(csv_bytes(HEADER, rows), "x.csv")
    by_key = {(s.build, s.device): s for s in summarize(result.measurements)}
    assert list(by_key) == [("qfold", "Pixel"), ("qfold", "iPhone"), ("repeat_kv", "iPhone")]
    q = by_key[("qfold", "iPhone")]
    assert q.n == 4 and q.mean_tok_per_s == pytest.approx(statistics.harmonic_mean(values), rel=1e-12)
    assert q.mean_s_per_token == pytest.approx(statistics.mean(1 / v for v in values), rel=1e-12)
    assert q.std_tok_per_s == pytest.approx(statistics.stdev(values))
    assert (q.min_tok_per_s, q.max_tok_per_s) == (53.8, 54.9)
    single = by_key[("repeat_kv", "iPhone")]
    assert (single.n, single.std_tok_per_s, single.mean_tok_per_s) == (1, 0.0, 20.39)


def test_harmonic_mean_differs_from_the_mean_of_rates() -> None:
    """10 and 30 tok/s are 0.1 and 0.0333 s/token: 0.0667 s on average, 15 tok/s, not 20 (issue #13)."""
    result = parse_log(csv_bytes(HEADER, "d,b,10\nd,b,30\n"), "x.csv")
    (s,) = summarize(result.measurements)
    assert s.mean_tok_per_s == pytest.approx(15.0, rel=1e-12) and s.n == 2


def test_summarize_never_averages_across_conditions() -> None:
    header = "device,build,tok_per_s,context_length,compute_units,quantization,os_version,phase\n"
    rows = [
        "d,b,10,512,ANE,int4,iOS 18,decode", "d,b,12,512,ANE,int4,iOS 18,decode",  # one condition: n = 2
        "d,b,9,4096,ANE,int4,iOS 18,decode", "d,b,11,512,GPU,int4,iOS 18,decode", "d,b,13,512,ANE,int8,iOS 18,decode",
        "d,b,14,512,ANE,int4,iOS 26,decode", "d,b,900,512,ANE,int4,iOS 18,prefill",
    ]
    result = parse_log(csv_bytes(header, *(r + "\n" for r in rows)), "x.csv")
    assert result.errors == ()
    decode = summarize(result.measurements)
    assert sorted(s.n for s in decode) == [1, 1, 1, 1, 2] and all(s.phase == "decode" for s in decode)
    every = summarize(result.measurements, phase=None)
    assert len(every) == 6 and {s.phase for s in every} == {"decode", "prefill"}
    pooled = next(s for s in decode if s.n == 2)
    assert (pooled.context_length, pooled.compute_units, pooled.quantization, pooled.os_version) == (
        512, "ANE", "int4", "iOS 18")


def test_records_are_frozen() -> None:
    m = parse_log(csv_bytes(HEADER, GOOD), "x.csv").measurements[0]
    with pytest.raises(AttributeError):
        m.tok_per_s = 1.0  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# The shipped example


def test_writeup_example_holds_exactly_the_published_figures() -> None:
    path = REPO / "examples" / "writeup_device_logs.csv"
    result = parse_log(path.read_bytes(), path.name)
    assert result.issues == ()
    got = {(m.device, m.build): m.tok_per_s for m in result.measurements}
    ab_device = "iPhone (A/B device, unnamed in write-up)"
    assert got == {
        (ab_device, "exaone-repeat_kv-top8"): 20.39,
        (ab_device, "exaone-qfold-top8"): 54.30,
        ("iPhone 16 Pro", "exaone-top8-device-table"): 44.0,
        ("iPhone 17 Pro", "exaone-top8-device-table"): 56.0,
        ("iPhone 16 Pro", "exaone-base-device-table"): 15.0,
        ("iPhone 17 Pro", "exaone-base-device-table"): 21.0,
    }
    for m in result.measurements:
        assert m.notes is not None and m.notes.startswith("Write-up section 4")
        assert m.context_length == (4096 if m.device == ab_device else None)


def test_random_corruptions_never_raise() -> None:
    """Seeded byte-level corruptions of valid CSV and llama-bench JSON: always a LogImport, never a crash."""
    base_csv = csv_bytes("device,build,tok_per_s,context_length,notes\n",
                         *(f'iPhone {i},b{i},{20 + i}.5,4096,"n, {i}"\n' for i in range(6)))
    base_json = json.dumps([llama_row() for _ in range(3)], indent=1).encode()
    alphabet = b'",\n\r;=+-@\t\x00\xff[]{}:0123456789.eE naN'
    rng = random.Random(2026)
    for _ in range(200):
        data = bytearray(rng.choice([base_csv, base_json]))
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(len(data) + 1)
            if rng.random() < 0.5:
                data[pos:pos] = bytes([rng.choice(alphabet)])
            else:
                del data[pos:pos + rng.randint(1, 20)]
        result = parse_log(bytes(data), "fuzz.csv")
        assert isinstance(result, LogImport) and len(result.files) == 1
        # Every accepted row is fully valid; every rejected file says why.
        assert all(m.tok_per_s > 0 and math.isfinite(m.tok_per_s) and m.device and m.build
                   for m in result.measurements)
        assert result.files[0].accepted or result.errors
