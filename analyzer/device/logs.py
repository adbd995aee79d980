"""Device benchmark logs → validated ``Measurement`` records, with every rejected row explained.

Why this module is strict: a throughput log is the only ground truth the bandwidth model is checked
against, and a CSV that is silently shifted by one column (or a "31,2" read as 31) turns a wrong
number into a confident conclusion. So every file goes through the same gates, in this order:

1. bytes → text: size limit, then strict UTF-8 (a UTF-8 BOM is stripped; UTF-16/32, Latin-1,
   NUL bytes and other control characters are rejected with the line they occur on);
2. format detection: llama.cpp ``llama-bench`` JSON (``-o json``, an array) or JSONL (``-o jsonl``)
   from the JSON shape, llama-bench CSV (``-o csv``) from its header, else qfold's own CSV schema;
3. structure, with Python's ``csv`` module and before pandas sees anything: column, row and field
   length limits, and the field count of every record against the header — a ragged row is
   rejected by its line number, never re-aligned. pandas then receives the already-split rows, so
   two CSV parsers can never disagree about where a field ends;
4. cell syntax (``tok_per_s`` must be a plain decimal number: no decimal commas, no units);
5. typed checks with a pandera schema (finite, > 0, non-empty labels, positive context length).

Policy: a file-level problem (encoding, limits, header) rejects the whole file; a bad row rejects
that row only and is listed with its line, column, value and reason. Line numbers are 1-based
lines of the file (header = line 1); a record whose quoted field spans several lines is reported
at the line it starts on. Cells are stripped of surrounding whitespace (``" 31.2 "`` is 31.2).
Formula-like text (``=``, ``+``, ``-``, ``@``, tab, CR … first: the set ``fmt.csv_safe`` escapes
on export) is kept verbatim, never evaluated, and flagged as a warning; a signed number is not.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

import numpy as np
import pandas as pd
import pandera.pandas as pa

from analyzer.fmt import csv_safe

Severity = Literal["error", "warning"]
LogFormat = Literal["qfold-csv", "llama-bench-csv", "llama-bench-json", "llama-bench-jsonl"]

REQUIRED_COLUMNS: tuple[str, ...] = ("device", "build", "tok_per_s")
OPTIONAL_COLUMNS: tuple[str, ...] = (
    "prompt_id",
    "context_length",
    "quantization",
    "compute_units",
    "os_version",
    "date",
    "notes",
)
KNOWN_COLUMNS: tuple[str, ...] = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
TEXT_COLUMNS: tuple[str, ...] = tuple(c for c in KNOWN_COLUMNS if c not in ("tok_per_s", "context_length"))

VALUE_PREVIEW_CHARS = 80
_INT64_MAX = 2**63 - 1

# llama-bench fields, as printed by `llama-bench -o csv|json|jsonl` (ggml-org/llama.cpp,
# tools/llama-bench/README.md, "Output formats"; read 2026-11-30).
LLAMA_BENCH_REQUIRED: tuple[str, ...] = ("n_prompt", "n_gen", "avg_ts")
LLAMA_BENCH_DEVICE_FIELDS: tuple[str, ...] = ("gpu_info", "cpu_info")
LLAMA_BENCH_BUILD_FIELDS: tuple[str, ...] = ("model_filename", "model_type")
# Any of these without a tok_per_s column marks llama-bench CSV, so a llama-bench file missing a
# field is told which llama-bench field is missing rather than that device/build are.
_LLAMA_BENCH_MARKERS = frozenset({"avg_ts", "n_prompt", "n_gen", "build_commit", "model_filename"})


class LogValidationError(ValueError):
    """A log file cannot be used at all; ``issues`` holds the file-level errors that say why."""

    def __init__(self, issues: Sequence[LogIssue]) -> None:
        self.issues: tuple[LogIssue, ...] = tuple(issues)
        super().__init__("; ".join(issue.describe() for issue in self.issues) or "log rejected")


@dataclass(frozen=True, slots=True)
class LogLimits:
    """Ceilings checked before a file's body is parsed, so an upload cannot exhaust memory or time.

    Defaults (judgement, not standards): 5 MiB holds ~50,000 qfold rows with notes, far more than a
    benchmark session; 100,000 rows still import in seconds; 64 columns leave room above
    llama-bench's ≈ 46 fields and qfold's 10; 4,096 characters fit any note or a llama-bench
    ``samples_ns`` list at a normal repetition count. A file over any limit is rejected whole.
    """

    max_file_bytes: int = 5 * 2**20
    max_rows: int = 100_000
    max_columns: int = 64
    max_field_chars: int = 4_096


@dataclass(frozen=True, slots=True)
class Measurement:
    """One accepted run: a device's decode throughput for a build, with where it came from."""

    file_name: str
    line: int
    device: str
    build: str
    tok_per_s: float
    prompt_id: str | None = None
    context_length: int | None = None
    quantization: str | None = None
    compute_units: str | None = None
    os_version: str | None = None
    date: str | None = None
    notes: str | None = None
    extra: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class LogIssue:
    """A rejected file or row, or a warning; enough to find the cell in an editor and fix it."""

    file_name: str
    line: int | None
    column: str | None
    value: str | None
    severity: Severity
    message: str

    def describe(self) -> str:
        """One line for a CLI or a UI banner: ``file:line, column 'x', value '…': reason``."""
        where = self.file_name if self.line is None else f"{self.file_name}:{self.line}"
        parts = [where]
        if self.column is not None:
            parts.append(f"column {self.column!r}")
        if self.value is not None:
            parts.append(f"value {self.value!r}")
        return f"{self.severity}: {', '.join(parts)}: {self.message}"


@dataclass(frozen=True, slots=True)
class FileReport:
    """What happened to one file: its detected format and how many records went where."""

    file_name: str
    format: LogFormat | None
    accepted: bool
    n_records: int
    n_accepted: int
    n_rejected: int
    n_skipped: int


@dataclass(frozen=True, slots=True)
class LogImport:
    """The outcome of importing one or more files: accepted rows, every issue, and per-file counts."""

    measurements: tuple[Measurement, ...]
    issues: tuple[LogIssue, ...]
    files: tuple[FileReport, ...]

    @property
    def errors(self) -> tuple[LogIssue, ...]:
        return tuple(i for i in self.issues if i.severity == "error")

    @property
    def warnings(self) -> tuple[LogIssue, ...]:
        return tuple(i for i in self.issues if i.severity == "warning")

    @property
    def rejected_files(self) -> tuple[str, ...]:
        """Files rejected whole (file-level error); their rows are not in ``measurements``."""
        return tuple(f.file_name for f in self.files if not f.accepted)

    def raise_if_rejected(self) -> None:
        """Raise ``LogValidationError`` listing the file-level errors, if any file was rejected whole."""
        rejected = set(self.rejected_files)
        if rejected:
            raise LogValidationError([i for i in self.errors if i.file_name in rejected])

    def measurements_frame(self) -> pd.DataFrame:
        """Accepted rows, one column per Measurement field; unknown columns expanded by name
        (prefixed ``extra:`` when a name would shadow a field, e.g. an uploaded ``line`` column)."""
        base = [f.name for f in fields(Measurement) if f.name != "extra"]
        records = []
        extra_names: dict[str, None] = {}
        for m in self.measurements:
            row = {name: getattr(m, name) for name in base}
            for key, value in m.extra:
                name = f"extra:{key}" if key in base else key
                extra_names.setdefault(name, None)
                row[name] = value
            records.append(row)
        frame = pd.DataFrame.from_records(records, columns=base + list(extra_names))
        frame["context_length"] = frame["context_length"].astype("Int64")
        frame["tok_per_s"] = frame["tok_per_s"].astype("float64")
        frame["line"] = frame["line"].astype("int64")
        return frame

    def issues_frame(self) -> pd.DataFrame:
        """Every issue, one row each (line is nullable: file-level issues have none)."""
        columns = [f.name for f in fields(LogIssue)]
        frame = pd.DataFrame.from_records(
            [{c: getattr(i, c) for c in columns} for i in self.issues], columns=columns
        )
        frame["line"] = frame["line"].astype("Int64")
        return frame


@dataclass(frozen=True, slots=True)
class BuildDeviceSummary:
    """Throughput statistics of one build on one device across its accepted runs.

    ``std_tok_per_s`` is the sample standard deviation (ddof = 1, an estimate of run-to-run
    spread); with one run there is no spread to estimate and it is reported as 0.0, not NaN, so
    tables and JSON stay numeric — read it together with ``n``.
    """

    build: str
    device: str
    n: int
    mean_tok_per_s: float
    std_tok_per_s: float
    min_tok_per_s: float
    max_tok_per_s: float


# ---------------------------------------------------------------------------------------------
# Internal records


class _RejectError(Exception):
    """A file-level error found while reading; caught in parse_log and turned into a LogIssue."""

    def __init__(self, message: str, line: int | None = None, column: str | None = None,
                 value: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column
        self.value = value


@dataclass(frozen=True, slots=True)
class _Row:
    """A record mapped onto qfold's columns, still as text, with the file column each came from."""

    line: int
    cells: dict[str, str]
    source: dict[str, str]
    extra: tuple[tuple[str, str], ...]


@dataclass(slots=True)
class _Collector:
    """Mutable scratch space for one file while it is being read."""

    file_name: str
    issues: list[LogIssue] = field(default_factory=list)
    n_records: int = 0
    n_skipped: int = 0
    header_line: int = 1
    format: LogFormat | None = None
    rejected_lines: set[int] = field(default_factory=set)

    def add(self, line: int | None, column: str | None, value: str | None, severity: Severity,
            message: str) -> None:
        self.issues.append(LogIssue(self.file_name, line, column, _preview(value), severity, message))
        if severity == "error" and line is not None:
            self.rejected_lines.add(line)


def _preview(value: str | None) -> str | None:
    if value is None or len(value) <= VALUE_PREVIEW_CHARS:
        return value
    return value[: VALUE_PREVIEW_CHARS - 1] + "…"


# ---------------------------------------------------------------------------------------------
# Gate 1: bytes → text

_UTF8_BOM = b"\xef\xbb\xbf"
_OTHER_BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\x00\x00\xfe\xff", "UTF-32 (big-endian)"),
    (b"\xff\xfe\x00\x00", "UTF-32 (little-endian)"),
    (b"\xfe\xff", "UTF-16 (big-endian)"),
    (b"\xff\xfe", "UTF-16 (little-endian)"),
)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def check_size(n_bytes: int, limits: LogLimits = LogLimits()) -> str | None:
    """The size-limit message for a file of ``n_bytes`` (None if within limits); callers holding a
    path (the CLI) use it to refuse a huge file before reading it."""
    if n_bytes > limits.max_file_bytes:
        return (f"file is {n_bytes:,} bytes, over the limit of {limits.max_file_bytes:,} bytes "
                f"({limits.max_file_bytes / 2**20:g} MiB)")
    return None


def _line_of_offset(data: bytes | str, offset: int) -> int:
    newline: bytes | str = b"\n" if isinstance(data, bytes) else "\n"
    return data.count(newline, 0, offset) + 1  # type: ignore[arg-type]


def _decode(data: bytes, limits: LogLimits) -> str:
    if len(data) == 0:
        raise _RejectError("file is empty (0 bytes)")
    too_big = check_size(len(data), limits)
    if too_big:
        raise _RejectError(too_big)
    for bom, encoding in _OTHER_BOMS:
        if data.startswith(bom):
            raise _RejectError(f"file is {encoding} (byte-order mark {bom.hex(' ').upper()}); "
                               "save it as UTF-8")
    data = data.removeprefix(_UTF8_BOM)
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        bad = data[e.start:e.start + 1].hex().upper()
        raise _RejectError(f"not valid UTF-8 at byte offset {e.start} (byte 0x{bad}); the file may be "
                           "Latin-1/Windows-1252 or binary: save it as UTF-8",
                           line=_line_of_offset(data, e.start)) from e
    # NUL is valid UTF-8 but never text; ASCII saved as UTF-16 without a BOM is every other byte NUL.
    nul = data.find(b"\x00")
    if nul >= 0:
        head = data[:200]
        if head.count(b"\x00") * 3 >= len(head):
            raise _RejectError("file contains NUL bytes between characters: it looks like UTF-16 without "
                               "a byte-order mark; save it as UTF-8", line=_line_of_offset(data, nul))
        raise _RejectError(f"NUL byte at byte offset {nul}: binary data is not a CSV or JSON log",
                           line=_line_of_offset(data, nul))
    control = _CONTROL.search(text)
    if control:
        raise _RejectError(f"control character U+{ord(control.group()):04X} at character offset "
                           f"{control.start()}: the file looks binary or corrupted",
                           line=_line_of_offset(text, control.start()))
    if not text.strip():
        raise _RejectError("file contains only whitespace")
    return text


# ---------------------------------------------------------------------------------------------
# Gate 3: structure (csv module), before pandas


def _is_blank(record: list[str]) -> bool:
    return len(record) <= 1 and not (record and record[0].strip())


def _read_csv(text: str, limits: LogLimits, col: _Collector) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """Header and data records (start line, fields); ragged records are reported, not returned."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    header_line = 1
    records: list[tuple[int, list[str]]] = []
    blank_lines: list[int] = []
    ragged: list[tuple[int, int, list[str]]] = []
    previous_end = 0
    try:
        for record in reader:
            start = previous_end + 1
            previous_end = reader.line_num
            if _is_blank(record):
                if header is not None:
                    blank_lines.append(start)
                continue
            if max(map(len, record)) > limits.max_field_chars:
                index, cell = next((i, c) for i, c in enumerate(record) if len(c) > limits.max_field_chars)
                name = header[index] if header is not None and index < len(header) else f"#{index + 1}"
                raise _RejectError(f"field is {len(cell):,} characters, over the limit of "
                                   f"{limits.max_field_chars:,}", line=start, column=name,
                                   value=_preview(cell))
            if header is None:
                header, header_line = record, start
                col.header_line = start
                if len(header) > limits.max_columns:
                    raise _RejectError(f"header has {len(header):,} columns, over the limit of "
                                       f"{limits.max_columns}", line=start)
                continue
            if len(records) + len(ragged) >= limits.max_rows:
                raise _RejectError(f"more than {limits.max_rows:,} data rows (limit); split the file",
                                   line=start)
            if len(record) != len(header):
                ragged.append((start, len(record), record))
            else:
                records.append((start, record))
    except csv.Error as e:
        # Reported at the line the broken record starts on: an unclosed quote runs to the end of file.
        start = previous_end + 1
        # The csv module stops at its own field limit (131,072 chars) before ours can be checked.
        if "field limit" in str(e):
            raise _RejectError(f"a field is longer than {csv.field_size_limit():,} characters (limit "
                               f"{limits.max_field_chars:,})", line=start) from e
        raise _RejectError(f"malformed CSV in the record starting on this line: {e}", line=start) from e
    if header is None:  # e.g. only '""' lines: not whitespace to _decode, but no field either
        raise _RejectError("no header row: every line is blank")
    if header_line != 1:
        col.add(None, None, None, "warning", f"header found on line {header_line}; lines above it are blank")
    # Blank lines after the last record are the usual file ending; interior ones are reported.
    last_data_line = max([line for line, _ in records] + [line for line, _, _ in ragged], default=0)
    for line in blank_lines:
        if line < last_data_line:
            col.add(line, None, None, "warning", "blank line ignored")
    if not records and not ragged:
        raise _RejectError("file has a header but no data rows", line=header_line)
    if ragged and not records and len({n for _, n, _ in ragged}) == 1:
        n = ragged[0][1]
        raise _RejectError(f"every data row has {n} fields but the header has {len(header)}: a column name "
                           "is missing from the header, or the rows are shifted (an index column?)",
                           line=ragged[0][0])
    for line, n, record in ragged:
        col.n_records += 1
        col.add(line, None, ",".join(record), "error",
                f"row has {n} fields but the header has {len(header)}; the row is rejected rather "
                "than re-aligned (a decimal comma or an unquoted comma in text?)")
    return header, records


def _normalize_header(header: list[str], col: _Collector) -> list[str]:
    names = [cell.strip() for cell in header]
    for index, name in enumerate(names):
        if not name:
            raise _RejectError(f"header column {index + 1} has no name (a trailing comma?)",
                               line=col.header_line)
    if len(names) == 1 and ";" in names[0]:
        raise _RejectError("the header is one column containing ';': semicolon-separated files are not "
                           "accepted; export with commas", line=col.header_line, value=names[0])
    known = {name.casefold(): name for name in KNOWN_COLUMNS}
    canonical = [known.get(name.casefold(), name) for name in names]
    seen: dict[str, int] = {}
    for index, name in enumerate(canonical):
        key = name.casefold()
        if key in seen:
            raise _RejectError(f"duplicate column name (columns {seen[key] + 1} and {index + 1})",
                               line=col.header_line,
                               column=names[index])
        seen[key] = index
    return canonical


# ---------------------------------------------------------------------------------------------
# Gate 2 + mapping: qfold CSV, llama-bench CSV / JSON / JSONL


def _qfold_rows(header: list[str], records: list[tuple[int, list[str]]], col: _Collector) -> list[_Row]:
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise _RejectError(f"missing required column(s) {', '.join(missing)}; the header has "
                           f"{', '.join(header)}", line=col.header_line, column=", ".join(missing))
    unknown = [c for c in header if c not in KNOWN_COLUMNS]
    if unknown:
        col.add(None, ", ".join(unknown), None, "warning",
                "unknown column(s) kept as extra fields, not interpreted")
    known = [(i, c) for i, c in enumerate(header) if c in KNOWN_COLUMNS]
    extra = [(i, c) for i, c in enumerate(header) if c not in KNOWN_COLUMNS]
    source = {c: c for c in KNOWN_COLUMNS}  # shared: every row's cells come from these columns
    col.n_records += len(records)
    return [
        _Row(line, {c: record[i] for i, c in known}, source, tuple((c, record[i]) for i, c in extra))
        for line, record in records
    ]


def _llama_bench_header_check(header: Sequence[str], col: _Collector) -> None:
    missing = [c for c in LLAMA_BENCH_REQUIRED if c not in header]
    if not any(c in header for c in LLAMA_BENCH_DEVICE_FIELDS):
        missing.append(" or ".join(LLAMA_BENCH_DEVICE_FIELDS))
    if not any(c in header for c in LLAMA_BENCH_BUILD_FIELDS):
        missing.append(" or ".join(LLAMA_BENCH_BUILD_FIELDS))
    if missing:
        raise _RejectError(f"llama-bench output without field(s) {', '.join(missing)}", line=col.header_line,
                           column=", ".join(missing))


def _nonneg_int(text: str) -> int | None:
    s = text.strip()
    return int(s) if re.fullmatch(r"[0-9]{1,18}", s) else None


def _llama_bench_row(line: int, cells: dict[str, str], col: _Collector) -> _Row | None:
    """Map one llama-bench result to qfold's columns; None when skipped or rejected (reported)."""
    col.n_records += 1
    counts: dict[str, int] = {}
    for name in ("n_prompt", "n_gen", "n_depth"):
        if name == "n_depth" and name not in cells:
            counts[name] = 0  # llama-bench before `-d` existed: generation started from depth 0
            continue
        value = _nonneg_int(cells.get(name, ""))
        if value is None:
            col.add(line, name, cells.get(name), "error", f"{name} must be a non-negative integer")
        else:
            counts[name] = value
    if len(counts) < 3:
        return None
    n_prompt, n_gen, n_depth = counts["n_prompt"], counts["n_gen"], counts["n_depth"]
    if n_gen == 0:
        col.n_skipped += 1
        col.add(line, "n_gen", "0", "warning",
                f"skipped deliberately: prompt-processing test pp{n_prompt} measures prefill, not "
                "decode throughput")
        return None
    if n_prompt > 0:
        col.n_skipped += 1
        col.add(line, "n_prompt", str(n_prompt), "warning",
                f"skipped deliberately: combined test pp{n_prompt}+tg{n_gen}; its avg_ts mixes prefill "
                "and decode")
        return None
    device_field = next((f for f in LLAMA_BENCH_DEVICE_FIELDS if cells.get(f, "").strip()), None)
    build_field = next((f for f in LLAMA_BENCH_BUILD_FIELDS if cells.get(f, "").strip()), None)
    if device_field is None:
        col.add(line, "gpu_info", "", "error", "gpu_info and cpu_info are both empty: no device name")
    if build_field is None:
        col.add(line, "model_filename", "", "error", "model_filename and model_type are both empty: "
                "no build label")
    if device_field is None or build_field is None:
        return None
    build = cells[build_field].strip()
    if build_field == "model_filename":
        build = re.split(r"[\\/]", build)[-1]  # a label: the file's name, never opened
    test = f"tg{n_gen}" + (f" @ d{n_depth}" if n_depth else "")
    spread = cells.get("stddev_ts", "").strip()
    notes = (f"llama-bench {test}" + (f" ± {spread} tok/s" if spread else "")
             + f"; device from {device_field}; build from {build_field}")
    ngl = cells.get("n_gpu_layers", "").strip()
    if ngl:
        notes += f"; n_gpu_layers {ngl}"  # gpu_info names the GPU even when no layer ran on it
    commit = cells.get("build_commit", "").strip()
    if commit:
        notes += f"; llama.cpp {commit}"
    mapped = {
        "device": (cells[device_field], device_field),
        "build": (build, build_field),
        "tok_per_s": (cells.get("avg_ts", ""), "avg_ts"),
        "context_length": (str(n_depth + n_gen), "n_depth+n_gen"),
        "quantization": (cells.get("model_type", ""), "model_type"),
        "compute_units": (cells.get("backends", ""), "backends"),
        "date": (cells.get("test_time", ""), "test_time"),
        "notes": (notes, "notes (generated)"),
    }
    consumed = {device_field, build_field, "avg_ts", "model_type", "backends", "test_time"}
    return _Row(
        line=line,
        cells={k: v for k, (v, _) in mapped.items()},
        source={k: s for k, (_, s) in mapped.items()},
        extra=tuple((k, v) for k, v in cells.items() if k not in consumed),
    )


def _json_text(value: object) -> str:
    """A JSON value as the text a CSV cell would hold (strings verbatim, the rest as JSON)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, allow_nan=True)


def _json_array_items(text: str) -> Iterator[tuple[int, object]]:
    """Elements of a top-level JSON array with the line each starts on (json gives no positions)."""
    decoder = json.JSONDecoder()
    ws = re.compile(r"\s*")
    pos = ws.match(text, 0).end()  # type: ignore[union-attr]
    pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]  # past '['
    if text.startswith("]", pos):
        end = pos + 1
    else:
        while True:
            value, end = decoder.raw_decode(text, pos)
            yield _line_of_offset(text, pos), value
            pos = ws.match(text, end).end()  # type: ignore[union-attr]
            if text.startswith(",", pos):
                pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]
                continue
            if text.startswith("]", pos):
                end = pos + 1
                break
            raise _RejectError("expected ',' or ']' between array elements", line=_line_of_offset(text, pos))
    if text[end:].strip():
        raise _RejectError("text after the closing ']'", line=_line_of_offset(text, end))


def _json_objects(text: str, fmt: LogFormat, limits: LogLimits,
                  col: _Collector) -> list[tuple[int, dict[str, str]]]:
    items: list[tuple[int, object]] = []
    line = 1
    too_many = f"more than {limits.max_rows:,} results (limit); split the file"
    try:
        if fmt == "llama-bench-json":
            for line, value in _json_array_items(text):
                items.append((line, value))
                if len(items) > limits.max_rows:
                    raise _RejectError(too_many, line=line)
        else:
            for line, raw in enumerate(text.splitlines(), start=1):
                if raw.strip():
                    items.append((line, json.loads(raw)))
                if len(items) > limits.max_rows:
                    raise _RejectError(too_many, line=line)
    except json.JSONDecodeError as e:
        # Whole-array positions are absolute; a JSONL line's are relative to that line.
        at = e.lineno if fmt == "llama-bench-json" else line
        raise _RejectError(f"invalid JSON: {e.msg}", line=at) from e
    except RecursionError as e:
        raise _RejectError("JSON is nested too deeply to be a llama-bench result") from e
    if not items:
        raise _RejectError("JSON array is empty: no results")
    objects: list[tuple[int, dict[str, str]]] = []
    for line, item in items:
        if not isinstance(item, dict):
            col.n_records += 1
            col.add(line, None, _json_text(item)[:VALUE_PREVIEW_CHARS], "error",
                    f"expected a llama-bench result object, got a JSON {type(item).__name__}")
            continue
        if len(item) > limits.max_columns:
            raise _RejectError(f"result has {len(item)} fields, over the limit of {limits.max_columns}",
                               line=line)
        cells = {str(k): _json_text(v) for k, v in item.items()}
        for key, value in cells.items():
            if len(value) > limits.max_field_chars:
                raise _RejectError(f"field is {len(value):,} characters, over the limit of "
                                   f"{limits.max_field_chars:,}", line=line, column=key,
                                   value=_preview(value))
        objects.append((line, cells))
    return objects


def _detect_json(text: str) -> LogFormat | None:
    first = text.lstrip()[:1]
    if first == "[":
        return "llama-bench-json"
    if first == "{":
        first_line = text.lstrip().splitlines()[0]
        try:
            json.loads(first_line)
        except (json.JSONDecodeError, RecursionError):
            raise _RejectError("a JSON object spanning several lines: llama-bench -o json writes an array "
                               "([...]) and -o jsonl one object per line") from None
        return "llama-bench-jsonl"
    return None


def _rows_from_text(text: str, limits: LogLimits, col: _Collector) -> tuple[LogFormat, list[_Row]]:
    fmt = col.format = _detect_json(text)
    if fmt is not None:
        objects = _json_objects(text, fmt, limits, col)
        keys = {k for _, obj in objects for k in obj}
        if not set(LLAMA_BENCH_REQUIRED) <= keys:
            raise _RejectError("JSON logs are accepted only as llama-bench output (-o json / -o jsonl); "
                               f"no result has all of {', '.join(LLAMA_BENCH_REQUIRED)}. Use CSV for "
                               "qfold's schema")
        rows = []
        for line, obj in objects:
            missing = [k for k in LLAMA_BENCH_REQUIRED if k not in obj]
            if missing:
                col.n_records += 1
                col.add(line, ", ".join(missing), None, "error", "llama-bench result without this field")
                continue
            row = _llama_bench_row(line, obj, col)
            if row is not None:
                rows.append(row)
        return fmt, rows
    header, records = _read_csv(text, limits, col)
    names = _normalize_header(header, col)
    if "tok_per_s" not in names and set(names) & _LLAMA_BENCH_MARKERS:
        col.format = "llama-bench-csv"
        _llama_bench_header_check(names, col)
        rows = []
        for line, record in records:
            row = _llama_bench_row(line, dict(zip(names, record, strict=True)), col)
            if row is not None:
                rows.append(row)
        return "llama-bench-csv", rows
    col.format = "qfold-csv"
    return "qfold-csv", _qfold_rows(names, records, col)


# ---------------------------------------------------------------------------------------------
# Gates 4 and 5: cell syntax, then the pandera schema

# ASCII digits only: float() would also take "٣١" or "３１", which no benchmark tool writes.
_NUMBER = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_PLAIN_NUMBER = re.compile(_NUMBER)
_NUMBER_WITH_UNIT = re.compile(rf"({_NUMBER})\s*([^0-9\s.,].*)")
_NAMED_FLOATS = {"nan": "NaN is not a measurement", "inf": None, "+inf": None, "-inf": None,
                 "infinity": None, "+infinity": None, "-infinity": None}


def parse_decimal(text: str, what: str = "the value") -> float:
    """A plain decimal number ("31.2", "2e3", "inf"), or ValueError saying why the text is not one.

    Why so strict: "31,2" is 31.2 in half the world's spreadsheets and 312 or 31 in a lenient
    parser; a unit in the cell means the column may be in different units row by row. Both are
    refused with a reason instead of guessed at. NaN is refused (it is not a measurement); ±inf
    parses, and range checks are the caller's.
    """
    s = text.strip()
    if not s:
        raise ValueError("empty: a number is required")
    lowered = s.casefold()
    if lowered in _NAMED_FLOATS:
        reason = _NAMED_FLOATS[lowered]
        if reason:
            raise ValueError(reason)
        return float(lowered)
    if _PLAIN_NUMBER.fullmatch(s):
        return float(s)
    if "," in s and re.fullmatch(r"[-+]?[0-9.,]+", s):
        raise ValueError("decimal commas (and thousands separators) are not accepted; write 31.2, not 31,2")
    if re.fullmatch(r"[-+]?[0-9_.]+", s):
        raise ValueError("digit separators are not accepted; write the plain number")
    unit = _NUMBER_WITH_UNIT.fullmatch(s)
    if unit:
        raise ValueError(f"units are not accepted in the cell ({unit.group(2)!r}); "
                         f"{what} takes a plain number")
    raise ValueError("not a number")


def _parse_tok_per_s(text: str) -> tuple[float | None, str | None]:
    """Cell → float, or the reason it is not a plain decimal number. Range checks are pandera's."""
    if not text.strip():
        return None, "missing: tok_per_s is required"
    try:
        return parse_decimal(text, "tok_per_s"), None
    except ValueError as e:
        return None, str(e)


def _parse_context_length(text: str) -> tuple[int | None, str | None]:
    s = text.strip()
    if not s:
        return None, None
    if re.fullmatch(r"[-+]?[0-9]+", s):
        value = int(s)
        if abs(value) > _INT64_MAX:
            return None, "context length is out of range"
        return value, None
    if re.fullmatch(r"[-+]?[0-9]+\.[0-9]*", s):
        return None, "context_length must be a whole number of tokens"
    if _NUMBER_WITH_UNIT.fullmatch(s):
        return None, "units or suffixes (k, tokens) are not accepted; write 4096"
    return None, "context_length must be a positive integer"


def _no_line_break(series: pd.Series) -> pd.Series:
    return ~series.str.contains(r"[\r\n]", regex=True)


MEASUREMENT_SCHEMA = pa.DataFrameSchema(
    {
        "device": pa.Column(str, [
            pa.Check.str_length(min_value=1, error="device is empty"),
            pa.Check(_no_line_break, error="line breaks are not allowed in device"),
        ]),
        "build": pa.Column(str, [
            pa.Check.str_length(min_value=1, error="build is empty"),
            pa.Check(_no_line_break, error="line breaks are not allowed in build"),
        ]),
        # Unparseable cells are NaN here and already reported; pandera checks skip nulls.
        "tok_per_s": pa.Column(float, [
            pa.Check(np.isfinite, error="tok_per_s must be finite"),
            pa.Check.gt(0, error="tok_per_s must be > 0 (a throughput cannot be zero or negative)"),
        ], nullable=True),
        "context_length": pa.Column("Int64", pa.Check.gt(0, error="context_length must be > 0"),
                                    nullable=True),
    },
    strict=True,
    name="qfold device measurements",
)
"""Typed checks of the parsed columns; index = the row's line number in its file."""


# First characters ``fmt.csv_safe`` escapes on export (= + - @ tab CR …): derived, not copied.
_FORMULA_FIRST = frozenset(c for c in map(chr, range(128)) if csv_safe(c) != c)


def _formula_like(raw: str) -> bool:
    """True for text a spreadsheet would run as a formula, also after leading spaces; a signed
    number ("-1") is data, not a formula."""
    first = raw[:1]
    if first not in _FORMULA_FIRST:
        if not first.isspace():
            return False
        first = raw.lstrip()[:1]
        if first not in _FORMULA_FIRST:
            return False
    return not _PLAIN_NUMBER.fullmatch(raw.strip())


def _validate(rows: list[_Row], col: _Collector) -> list[Measurement]:
    if not rows:
        return []
    lines = [row.line for row in rows]
    tok: list[float] = []
    ctx: list[int | None] = []
    for row in rows:
        value, reason = _parse_tok_per_s(row.cells.get("tok_per_s", ""))
        if reason:
            col.add(row.line, row.source["tok_per_s"], row.cells.get("tok_per_s", ""), "error", reason)
        tok.append(math.nan if value is None else value)
        length, reason = _parse_context_length(row.cells.get("context_length", ""))
        if reason:
            col.add(row.line, row.source["context_length"], row.cells["context_length"], "error", reason)
        ctx.append(length)
    frame = pd.DataFrame(
        {
            "device": pd.Series([row.cells["device"].strip() for row in rows], dtype=str),
            "build": pd.Series([row.cells["build"].strip() for row in rows], dtype=str),
            "tok_per_s": pd.Series(tok, dtype="float64"),
            "context_length": pd.Series(ctx, dtype="Int64"),
        }
    )
    frame.index = pd.Index(lines, name="line")
    by_line = {row.line: row for row in rows}
    try:
        MEASUREMENT_SCHEMA.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as e:
        for failure in e.failure_cases.itertuples(index=False):
            if pd.isna(failure.index):  # a column-level failure: our own frame is malformed
                raise _RejectError(f"internal schema check failed: {failure.check}") from e
            line = int(failure.index)
            column = str(failure.column)
            row = by_line[line]
            col.add(line, row.source.get(column, column), row.cells.get(column), "error", str(failure.check))

    measurements = []
    formula = "formula-like text kept as plain text (never evaluated); escaped on CSV export"
    for row, tok_per_s, context_length in zip(rows, tok, ctx, strict=True):
        stripped: dict[str, str | None] = {}
        for column in TEXT_COLUMNS:
            raw = row.cells.get(column)
            if raw is None:
                continue
            if _formula_like(raw):
                col.add(row.line, row.source.get(column, column), raw, "warning", formula)
            stripped[column] = raw.strip() or None
        for column, raw in row.extra:
            if _formula_like(raw):
                col.add(row.line, column, raw, "warning", formula)
        if row.line in col.rejected_lines:
            continue
        measurements.append(Measurement(
            file_name=col.file_name,
            line=row.line,
            device=stripped["device"] or "",
            build=stripped["build"] or "",
            tok_per_s=float(tok_per_s),
            prompt_id=stripped.get("prompt_id"),
            context_length=context_length,
            quantization=stripped.get("quantization"),
            compute_units=stripped.get("compute_units"),
            os_version=stripped.get("os_version"),
            date=stripped.get("date"),
            notes=stripped.get("notes"),
            extra=tuple((k, v.strip()) for k, v in row.extra),
        ))
    return measurements


# ---------------------------------------------------------------------------------------------
# Public entry points


def _label(name: str) -> str:
    """The display label of an upload: its name with control characters removed (never a path)."""
    cleaned = _CONTROL.sub("", name.replace("\n", " ").replace("\r", " ").replace("\t", " ")).strip()
    return cleaned[:255] or "<unnamed>"


def parse_log(data: bytes, name: str, limits: LogLimits = LogLimits()) -> LogImport:
    """Import one uploaded log. Never raises for bad content: problems come back as ``issues``.

    ``name`` is only a label for messages (an upload's file name); nothing is read from disk.
    """
    label = _label(name)
    col = _Collector(label)
    try:
        text = _decode(data, limits)
        _, rows = _rows_from_text(text, limits, col)
        measurements = _validate(rows, col)
    except _RejectError as e:
        issue = LogIssue(label, e.line, e.column, _preview(e.value), "error", e.message)
        report = FileReport(label, col.format, False, col.n_records, 0, col.n_records - col.n_skipped,
                            col.n_skipped)
        return LogImport((), (issue,), (report,))
    issues = sorted(col.issues, key=lambda i: (i.line is not None, i.line or 0))
    report = FileReport(
        file_name=label,
        format=col.format,
        accepted=True,
        n_records=col.n_records,
        n_accepted=len(measurements),
        n_rejected=col.n_records - len(measurements) - col.n_skipped,
        n_skipped=col.n_skipped,
    )
    return LogImport(tuple(measurements), tuple(issues), (report,))


def parse_logs(files: Sequence[tuple[str, bytes]], limits: LogLimits = LogLimits()) -> LogImport:
    """Import several uploads into one result; each row keeps its file label and line.

    Two uploads with the same name get " (2)", " (3)" … appended to the later labels (with a
    warning) so that a line number always points into exactly one file.
    """
    measurements: list[Measurement] = []
    issues: list[LogIssue] = []
    reports: list[FileReport] = []
    seen: dict[str, int] = {}
    for name, data in files:
        label = _label(name)
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            renamed = f"{label} ({seen[label]})"
            issues.append(LogIssue(renamed, None, None, None, "warning",
                                   f"another file is also named {label!r}; this one is labelled {renamed!r}"))
            label = renamed
        result = parse_log(data, label, limits)
        measurements.extend(result.measurements)
        issues.extend(result.issues)
        reports.extend(result.files)
    return LogImport(tuple(measurements), tuple(issues), tuple(reports))


def summarize(measurements: Sequence[Measurement]) -> list[BuildDeviceSummary]:
    """n, mean, sample std (0.0 for one run), min and max tok/s per (build, device), sorted."""
    groups: dict[tuple[str, str], list[float]] = {}
    for m in measurements:
        groups.setdefault((m.build, m.device), []).append(m.tok_per_s)
    summaries = []
    for (build, device), values in sorted(groups.items()):
        arr = np.asarray(values, dtype=np.float64)
        summaries.append(BuildDeviceSummary(
            build=build,
            device=device,
            n=len(values),
            mean_tok_per_s=float(arr.mean()),
            std_tok_per_s=float(arr.std(ddof=1)) if len(values) > 1 else 0.0,
            min_tok_per_s=float(arr.min()),
            max_tok_per_s=float(arr.max()),
        ))
    return summaries
