"""llama.cpp ``llama-bench``, every output format: markdown (the default), CSV, JSON, JSONL and SQL.

Each format is read into llama-bench's own fields (``n_prompt, n_gen, n_depth, avg_ts, model_type, …``) and
one mapping turns them into qfold's columns, so the five formats cannot disagree. Field names, the test
naming and the printers are those of ``tools/llama-bench/llama-bench.cpp`` (ggml-org/llama.cpp; the ``test``
struct, ``markdown_printer`` and ``sql_printer``, read 2026-12-01):

- a test is ``pp<n_prompt>`` (prefill), ``tg<n_gen>`` (decode) or ``pp<n>+tg<m>`` (both in one timed run), with
  `` @ d<n_depth>`` when the KV cache was first filled with ``n_depth`` tokens (``-d``); old builds print
  ``pp 512`` / ``tg 128`` with a space;
- ``avg_ts`` is the mean over repetitions of (n_prompt + n_gen) / seconds; markdown prints it as
  ``avg ± stddev`` in the ``t/s`` column and ends with ``build: <commit> (<number>)``;
- markdown names fields by display name (``model`` = model_type, ``backend`` = backends, ``ngl`` =
  n_gpu_layers) and carries no device: labels, else the file name, stand in.

``context_length`` is derived: n_depth + n_gen for a decode run (the KV positions the last generated token
attends over; llama.cpp's cache grows with the sequence), n_depth + n_prompt for a prefill run.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from analyzer.measure.logs.cells import nonneg_int
from analyzer.measure.logs.readers.tables import Table, read_csv_table
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError, mapped

REQUIRED_FIELDS: tuple[str, ...] = ("n_prompt", "n_gen", "avg_ts")
DEVICE_FIELDS: tuple[str, ...] = ("gpu_info", "cpu_info")
BUILD_FIELDS: tuple[str, ...] = ("model_filename", "model_type")
# Any of these without a tok_per_s column marks llama-bench CSV, so a llama-bench file missing a field is
# told which llama-bench field is missing rather than that qfold's columns are.
MARKERS = frozenset({"avg_ts", "n_prompt", "n_gen", "build_commit", "model_filename"})
# markdown_printer's display names for the fields the mapping reads (get_field_display_name).
MARKDOWN_FIELDS: Mapping[str, str] = {"model": "model_type", "backend": "backends", "ngl": "n_gpu_layers"}

_TEST = re.compile(r"(?:pp\s*(?P<p>[0-9]{1,9}))?(?P<plus>\+)?(?:tg\s*(?P<g>[0-9]{1,9}))?(?:\s*@\s*d(?P<d>[0-9]{1,9}))?")
_TS = re.compile(r"(?P<avg>[^\s±]+)\s*(?:±|\+/-|\+-)\s*(?P<std>\S+)")
_FOOTER = re.compile(r"build:\s*(?P<commit>\S+)\s*\((?P<number>[0-9]+)\)")


def is_llama_bench_header(header: list[str]) -> bool:
    return "tok_per_s" not in header and bool(set(header) & MARKERS)


def is_llama_bench_markdown(header: list[str]) -> bool:
    return "test" in header and "t/s" in header


def _phase_of(n_prompt: int, n_gen: int) -> str:
    if n_gen == 0:
        return "prefill"
    return "decode" if n_prompt == 0 else "mixed"


def test_name(n_prompt: int, n_gen: int, n_depth: int) -> str:
    """The test as ``markdown_printer`` names it: ``pp512``, ``tg128``, ``pp512+tg128``, ``tg128 @ d4096``."""
    phase = _phase_of(n_prompt, n_gen)
    name = {"prefill": f"pp{n_prompt}", "decode": f"tg{n_gen}", "mixed": f"pp{n_prompt}+tg{n_gen}"}[phase]
    return name + (f" @ d{n_depth}" if n_depth else "")


def _context(phase: str, n_prompt: int, n_gen: int, n_depth: int) -> tuple[int, str]:
    if phase == "decode":
        return n_depth + n_gen, ("n_depth + n_gen: the KV positions the last generated token attends over "
                                 "(llama.cpp's cache grows with the sequence)")
    if phase == "prefill":
        return n_depth + n_prompt, "n_depth + n_prompt: the KV positions the last prompt token attends over"
    return n_depth + n_prompt + n_gen, "n_depth + n_prompt + n_gen: the positions at the end of the run"


def map_result(line: int, record: int, cells: dict[str, str], col: Collector, *,
               counts: tuple[int, int, int] | None = None, counts_column: str | None = None,
               ts_column: str = "avg_ts", shared_line: bool = False) -> RawRow | None:
    """One llama-bench result (its own field names) → a RawRow, or None when refused (reported).

    ``counts`` (n_prompt, n_gen, n_depth) are given by readers that parsed them from ``counts_column`` (the
    markdown ``test`` column); ``ts_column`` names where avg_ts was read, for messages.
    """
    def error(column: str | None, value: str | None, message: str) -> None:
        col.add(line, column, value, "error", message, record=record, shared_line=shared_line)

    if counts is None:
        parsed: dict[str, int] = {}
        for name in ("n_prompt", "n_gen", "n_depth"):
            if name == "n_depth" and name not in cells:
                parsed[name] = 0  # llama-bench before `-d` existed: every test started from an empty cache
                continue
            value = nonneg_int(cells.get(name, ""))
            if value is None:
                error(name, cells.get(name), f"{name} must be a non-negative integer")
            else:
                parsed[name] = value
        if len(parsed) < 3:
            return None
        counts = parsed["n_prompt"], parsed["n_gen"], parsed["n_depth"]
    n_prompt, n_gen, n_depth = counts
    if n_prompt == 0 and n_gen == 0:
        error("n_gen", "0", "n_prompt and n_gen are both 0: the result measured no tokens")
        return None
    phase = _phase_of(n_prompt, n_gen)
    test = test_name(n_prompt, n_gen, n_depth)
    context_length, context_how = _context(phase, n_prompt, n_gen, n_depth)

    device_field = next((f for f in DEVICE_FIELDS if cells.get(f, "").strip()), None)
    build_field = next((f for f in BUILD_FIELDS if cells.get(f, "").strip()), None)
    columns: dict[str, tuple[str, str]] = {
        "tok_per_s": (cells.get("avg_ts", ""), ts_column),
        "phase": (phase, counts_column or "n_prompt/n_gen"),
        "context_length": (str(context_length), counts_column or "n_depth+n_gen"),
        "prompt_tokens": (str(n_prompt), counts_column or "n_prompt"),
        "quantization": (cells.get("model_type", ""), "model_type"),
        "compute_units": (cells.get("backends", ""), "backends"),
        "date": (cells.get("test_time", ""), "test_time"),
    }
    if device_field is not None:
        columns["device"] = (cells[device_field], device_field)
    elif any(f in cells for f in DEVICE_FIELDS):
        columns["device"] = ("", "gpu_info/cpu_info")  # present but empty: an error unless a label is given
    if build_field is not None:
        build = cells[build_field].strip()
        if build_field == "model_filename":
            build = re.split(r"[\\/]", build)[-1]  # a label: the file's name, never opened
        columns["build"] = (build, build_field)
    elif any(f in cells for f in BUILD_FIELDS):
        columns["build"] = ("", "model_filename/model_type")

    spread = cells.get("stddev_ts", "").strip()
    notes = f"llama-bench {test}" + (f" ± {spread} tok/s" if spread else "")
    if device_field:
        notes += f"; device from {device_field}"
    if build_field:
        notes += f"; build from {build_field}"
    ngl = cells.get("n_gpu_layers", "").strip()
    if ngl:
        notes += f"; n_gpu_layers {ngl}"  # gpu_info names the GPU even when no layer ran on it
    commit = cells.get("build_commit", "").strip()
    if commit:
        notes += f"; llama.cpp {commit}"
    columns["notes"] = (notes, "notes (generated)")
    consumed = {device_field, build_field, "avg_ts", "model_type", "backends", "test_time"}
    values, source = mapped(columns)
    return RawRow(
        line=line,
        record=record,
        cells=values,
        source=source,
        extra=tuple((k, v) for k, v in cells.items() if k not in consumed),
        derived=(("phase", "from the llama-bench test: tg decode, pp prefill, pp+tg mixed"),
                 ("context_length", context_how), ("prompt_tokens", "n_prompt of the llama-bench test")),
        shared_line=shared_line,
    )


def check_fields(names: set[str], line: int | None) -> None:
    missing = [f for f in REQUIRED_FIELDS if f not in names]
    if missing:
        raise RejectError(f"llama-bench output without field(s) {', '.join(missing)}", line=line,
                          column=", ".join(missing))


# ---------------------------------------------------------------------------------------------
# CSV (-o csv) and markdown (-o md, the default)


def read_csv(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    table = read_csv_table(text, limits, col, header_check=lambda names, line: check_fields(set(names), line))
    rows = []
    for line, record, fields in table.rows:
        row = map_result(line, record, dict(zip(table.header, fields, strict=True)), col)
        if row is not None:
            rows.append(row)
    return rows


def _footer(table: Table) -> dict[str, str]:
    for _, note in table.notes:
        match = _FOOTER.fullmatch(note)
        if match:
            return {"build_commit": match["commit"], "build_number": match["number"]}
    return {}


def markdown_table_rows(table: Table, col: Collector) -> list[RawRow]:
    """Rows of one llama-bench markdown table (its ``build:`` footer applies to all of them)."""
    footer = _footer(table)
    rows = []
    for line, record, fields in table.rows:
        cells = {MARKDOWN_FIELDS.get(name, name): value for name, value in zip(table.header, fields, strict=True)}
        test = cells.pop("test")
        match = _TEST.fullmatch(test.strip())
        if not match or not (match["p"] or match["g"]) or bool(match["plus"]) != bool(match["p"] and match["g"]):
            col.add(line, "test", test, "error", "not a llama-bench test: expected pp<n>, tg<n> or pp<n>+tg<n>, "
                    "optionally followed by ' @ d<depth>'", record=record)
            continue
        counts = int(match["p"] or 0), int(match["g"] or 0), int(match["d"] or 0)
        ts = cells.pop("t/s").strip()
        spread = _TS.fullmatch(ts)
        cells["avg_ts"], cells["stddev_ts"] = (spread["avg"], spread["std"]) if spread else (ts, "")
        row = map_result(line, record, {**cells, **footer}, col, counts=counts, counts_column="test",
                         ts_column="t/s")
        if row is not None:
            rows.append(row)
    return rows
