"""Property tests (hypothesis): whatever bytes arrive, the log importer answers with a ``LogImport`` (or, at
most, qfold's own error) and every row it accepts is a valid measurement.

Inputs: random bytes; random CSV tables (qfold and llama-bench headers, hostile cells: NaN, 1e300, decimal
commas, quotes, line breaks, formula text, invisible characters); random JSON (llama-bench-like objects with
random values, arbitrary nesting); random markdown tables; runner lines with random numbers. Invariants that
could fail: counts add up, accepted tok/s inside the range, labels normalised and non-empty, counts in range.
"""

from __future__ import annotations

import csv
import io
import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.errors import QfoldError
from analyzer.measure.logs import (
    PHASES,
    TOK_PER_S_RANGE,
    TOKEN_COUNT_MAX,
    LogImport,
    normalize_label,
    parse_log,
    parse_logs,
)

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow],
                    derandomize=True)

NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-10**20, max_value=10**20).map(str),
    st.sampled_from(["1e-300", "1e300", "31,2", "1_000", "31 tok/s", "", "-0", "NaN", "inf", "4k", "0x10", "٣١"]),
)
TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["=SUM(A1)", "+x", "@cmd", "b1\u200b", "\u202eevil", " padded ", "a,b", 'q"uote', "line\nbreak",
                     "ｂ１", "decode", "prefill", "mixed", "tg128", "pp512+tg128 @ d4096", "197.71 ± 0.81"]),
)
CELL = st.one_of(NUMBERS, TEXT)
QFOLD_COLUMNS = ["device", "build", "tok_per_s", "context_length", "prompt_tokens", "phase", "notes", "extra"]
LLAMA_COLUMNS = ["gpu_info", "cpu_info", "model_filename", "model_type", "n_prompt", "n_gen", "n_depth", "avg_ts",
                 "stddev_ts", "backends", "test_time"]


def check(result: LogImport) -> None:
    """What every import must satisfy, whatever went in."""
    assert isinstance(result, LogImport)
    (report,) = result.files
    assert report.accepted or result.errors, "a rejected file always says why"
    assert len(result.measurements) == report.n_accepted
    if report.accepted:
        assert report.n_accepted + report.n_rejected + report.n_skipped == report.n_records
        assert min(report.n_accepted, report.n_rejected, report.n_skipped) >= 0
    lo, hi = TOK_PER_S_RANGE
    for m in result.measurements:
        assert math.isfinite(m.tok_per_s) and lo <= m.tok_per_s <= hi
        assert m.phase in PHASES
        for label in (m.device, m.build):
            assert label and label == normalize_label(label) and "\n" not in label and "\r" not in label
        assert m.context_length is None or 1 <= m.context_length <= TOKEN_COUNT_MAX
        assert m.prompt_tokens is None or 0 <= m.prompt_tokens <= TOKEN_COUNT_MAX
    for issue in result.issues:
        assert issue.file_name == report.file_name and issue.message


def run(data: bytes) -> None:
    try:
        result = parse_log(data, "fuzz.log")
    except QfoldError:
        return  # allowed by the contract; parse_log in fact never raises for content
    check(result)


@SETTINGS
@given(st.binary(max_size=3000))
def test_random_bytes(data: bytes) -> None:
    run(data)


@SETTINGS
@given(st.text(max_size=2000))
def test_random_text(text: str) -> None:
    run(text.encode("utf-8"))


GOOD_RATE = st.floats(min_value=1e-3, max_value=1e6).map(lambda x: f"{x:.6g}")
GOOD_COUNT = st.integers(min_value=1, max_value=100_000).map(str)


def mostly(good: st.SearchStrategy[str], bad: st.SearchStrategy[str] = CELL) -> st.SearchStrategy[str]:
    """Valid values most of the time, hostile ones otherwise: so rows are accepted AND refused."""
    return st.one_of(good, good, good, bad)


@st.composite
def csv_tables(draw: st.DrawFn) -> bytes:
    if draw(st.booleans()):  # qfold's schema
        columns = ["device", "build", "tok_per_s", *draw(st.lists(st.sampled_from(QFOLD_COLUMNS[3:]), unique=True))]
        good = {"tok_per_s": GOOD_RATE, "context_length": GOOD_COUNT, "prompt_tokens": GOOD_COUNT,
                "phase": st.sampled_from(PHASES)}
    else:  # llama-bench's
        columns = ["gpu_info", "model_type", "n_prompt", "n_gen", "avg_ts",
                   *draw(st.lists(st.sampled_from(LLAMA_COLUMNS), unique=True))]
        columns = list(dict.fromkeys(columns))
        good = {"avg_ts": GOOD_RATE, "n_prompt": st.sampled_from(["0", "512"]), "n_gen": st.sampled_from(["0", "128"]),
                "n_depth": GOOD_COUNT}
    columns = draw(st.permutations(columns))
    row = st.tuples(*(mostly(good.get(c, TEXT)) for c in columns)).map(list)
    rows = draw(st.lists(st.one_of(row, row, row, st.lists(CELL, max_size=len(columns) + 1)), max_size=8))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator=draw(st.sampled_from(["\n", "\r\n"])))
    writer.writerow(columns)
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8", "replace")


@SETTINGS
@given(csv_tables())
def test_random_csv_tables(data: bytes) -> None:
    run(data)


JSON_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=10))
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
LLAMA_OBJECTS = st.fixed_dictionaries(
    {"n_prompt": st.one_of(st.sampled_from([0, 512]), st.integers(-5, 5000), JSON_SCALARS),
     "n_gen": st.one_of(st.sampled_from([0, 128]), st.integers(-5, 5000), JSON_SCALARS),
     "avg_ts": st.one_of(st.floats(min_value=1e-3, max_value=1e6), st.floats(allow_nan=True, allow_infinity=True),
                         JSON_SCALARS)},
    optional={"n_depth": st.integers(-5, 10**9), "gpu_info": TEXT, "model_type": TEXT, "model_filename": TEXT,
              "samples_ts": JSON_VALUES},
)


@SETTINGS
@given(st.lists(st.one_of(LLAMA_OBJECTS, JSON_VALUES), max_size=6), st.sampled_from(["array", "minified", "jsonl"]))
def test_random_json(objects: list, layout: str) -> None:
    if layout == "jsonl":
        text = "\n".join(json.dumps(o) for o in objects) + "\n"
    else:
        text = json.dumps(objects, indent=None if layout == "minified" else 2)
    run(text.encode())


@st.composite
def markdown_tables(draw: st.DrawFn) -> bytes:
    extra = draw(st.lists(st.sampled_from(["backend", "ngl", "size", "threads", "device"]), unique=True, max_size=3))
    columns = draw(st.permutations(["model", "test", "t/s", *extra]))
    good = {"test": st.sampled_from(["tg128", "pp512", "pp512+tg128", "tg 128", "tg128 @ d4096"]),
            "t/s": st.tuples(GOOD_RATE, GOOD_RATE).map(" ± ".join)}
    cell = {c: mostly(good.get(c, TEXT)).map(lambda v: v.replace("|", "\\|").replace("\n", " ")) for c in columns}
    row = st.tuples(*(cell[c] for c in columns)).map(list)
    rows = draw(st.lists(st.one_of(row, row, row, st.lists(CELL.map(lambda v: v.replace("\n", " ")), max_size=5)),
                         max_size=6))
    prefix = draw(st.sampled_from(["", "    # ", "> "]))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += draw(st.sampled_from([[], ["", "build: 3e0ba0e60 (4229)"]]))
    return "".join(prefix + line + "\n" for line in lines).encode("utf-8", "replace")


@SETTINGS
@given(markdown_tables())
def test_random_markdown_tables(data: bytes) -> None:
    run(data)


@st.composite
def runner_logs(draw: st.DrawFn) -> bytes:
    """A runner's block with consistent numbers, then some of its numbers swapped for hostile ones."""
    n_prompt, n_gen = draw(st.integers(1, 5000)), draw(st.integers(0, 5000))
    ms = draw(st.floats(min_value=1.0, max_value=1e6))
    tps = n_gen * 1e3 / ms
    blocks = [
        [f"llama_perf_context_print: prompt eval time = {ms:10.2f} ms / {n_prompt:5d} tokens "
         f"({ms / n_prompt:8.2f} ms per token, {n_prompt * 1e3 / ms:8.2f} tokens per second)",
         f"llama_perf_context_print:        eval time = {ms:10.2f} ms / {n_gen:5d} runs   "
         f"({ms / max(n_gen, 1):8.2f} ms per token, {tps:8.2f} tokens per second)"],
        [f"Prompt: {n_prompt} tokens, {n_prompt * 1e3 / ms:.3f} tokens-per-sec",
         f"Generation: {n_gen} tokens, {tps:.3f} tokens-per-sec", f"Peak memory: {ms / 1e3:.3f} GB"],
        [f'PyTorchObserver {{"prompt_tokens":{n_prompt},"generated_tokens":{n_gen},"inference_start_ms":1000,'
         f'"prompt_eval_end_ms":{1000 + int(ms)},"inference_end_ms":{1000 + 2 * int(ms)},'
         '"SCALING_FACTOR_UNITS_PER_SECOND":1000}'],
        ["Input length: 32, Cache length: 992", f"Prefill: {n_prompt} tokens in {ms / 1e3:.2f}s",
         f"Decode: {n_gen} tokens in {ms / 1e3:.2f}s ({tps:.2f} tok/s)"],
        ["Using context length: 512", f"Prefill: {ms:.1f}ms ({n_prompt * 1e3 / ms:.1f} t/s)",
         f"Inference: {tps:.1f} t/s", f"Total: Generated {n_gen} tokens in {ms / 1e3:.2f}s"],
    ]
    lines = draw(st.sampled_from(blocks)) * draw(st.integers(1, 3))
    words = "\n".join(lines).split(" ")
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(words) - 1))
        words[at] = draw(NUMBERS)
    return (" ".join(words) + "\n").encode("utf-8", "replace")


@SETTINGS
@given(runner_logs())
def test_random_runner_logs(data: bytes) -> None:
    run(data)


@SETTINGS
@given(st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=300)), max_size=4),
       st.one_of(st.none(), st.text(min_size=1, max_size=8)))
def test_several_files_and_labels(files: list, device: str | None) -> None:
    try:
        result = parse_logs(files, device=device)
    except ValueError:  # only an unusable label is refused, before any file is read
        assert device is not None
        label = normalize_label(device)
        assert not label or any(ord(c) < 32 or c == "\x7f" for c in label)
        return
    assert len(result.files) == len(files)
    assert len({f.file_name for f in result.files}) == len(files)  # every line points into exactly one file
