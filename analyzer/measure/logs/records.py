"""The public records of a log import: what was accepted, what was refused and why, and per-file counts.

Units are in the field names (``tok_per_s``, ``context_length`` in tokens); the accepted ranges live here,
with their reasons, because both the validator and the bandwidth model refuse values outside them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Literal

import pandas as pd

from analyzer.errors import QfoldError

Severity = Literal["error", "warning"]
Phase = Literal["decode", "prefill", "mixed"]
PHASES: tuple[Phase, ...] = ("decode", "prefill", "mixed")
"""decode: one token per step (llama-bench ``tg``); prefill: a prompt in batches (``pp``); mixed: both in one timed
run (llama-bench ``pp512+tg128``), whose tok/s blends two regimes and is fitted with neither."""

REQUIRED_COLUMNS: tuple[str, ...] = ("device", "build", "tok_per_s")
OPTIONAL_COLUMNS: tuple[str, ...] = (
    "prompt_id",
    "context_length",
    "quantization",
    "compute_units",
    "os_version",
    "date",
    "notes",
    "phase",
    "prompt_tokens",
)
KNOWN_COLUMNS: tuple[str, ...] = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
NUMERIC_COLUMNS: tuple[str, ...] = ("tok_per_s", "context_length", "prompt_tokens")
TEXT_COLUMNS: tuple[str, ...] = tuple(c for c in KNOWN_COLUMNS if c not in NUMERIC_COLUMNS and c != "phase")
LABEL_COLUMNS: tuple[str, ...] = ("device", "build")
"""Columns a format may lack; the user's labels, else the file name, fill them (see ``LabelDefaults``)."""

VALUE_PREVIEW_CHARS = 80

TOK_PER_S_RANGE: tuple[float, float] = (1e-3, 1e6)
"""Accepted tok/s, inclusive. Judgement, not a standard: 0.001 tok/s is 1,000 s per token (a 128-token
llama-bench ``tg128`` would run 36 h), slower than any benchmark that finishes; 10^6 tok/s is ~10x above the
fastest published prefill rates (llama-bench pp512 of small models on datacenter GPUs, ~10^4-10^5 tok/s).
Inside this range the bandwidth model's 1 / tok_per_s and BW x seconds stay finite; 1e-300 or 1e300 would not
(issue #11: 1e300 tok/s read back as 0 bytes/token)."""

TOKEN_COUNT_MAX = 2**24
"""Largest accepted context_length / prompt_tokens (16,777,216 tokens): above the longest published context
window (10M tokens, Llama 4 Scout, Meta AI blog 2025-04-05), and small enough that counts stay exact in float64."""


class LogValidationError(QfoldError):
    """A log file cannot be used at all; ``issues`` holds the file-level errors that say why."""

    def __init__(self, issues: Sequence[LogIssue]) -> None:
        self.issues: tuple[LogIssue, ...] = tuple(issues)
        super().__init__("; ".join(issue.describe() for issue in self.issues) or "log rejected")


@dataclass(frozen=True, slots=True)
class LogLimits:
    """Ceilings checked before a file's body is parsed, so an upload cannot exhaust memory or time.

    Defaults (judgement, not standards): 5 MiB holds ~50,000 qfold rows with notes or a long runner log, far
    more than a benchmark session; 100,000 records still import in seconds; 64 columns leave room above
    llama-bench's ≈ 46 fields and qfold's 12; 4,096 characters fit any note or a llama-bench ``samples_ns``
    list at a normal repetition count. A file over any limit is rejected whole.
    """

    max_file_bytes: int = 5 * 2**20
    max_rows: int = 100_000
    max_columns: int = 64
    max_field_chars: int = 4_096


DEFAULT_LIMITS = LogLimits()


@dataclass(frozen=True, slots=True)
class Measurement:
    """One accepted run: a device's throughput for a build in one phase, with where it came from.

    ``context_length`` is the KV positions one step attends over: for a decode run the static cache size of
    a Core ML graph with a static cache, or depth + generated tokens for a dynamic-cache runner (llama-bench
    ``n_depth + n_gen``). ``derived`` names every field the importer computed rather than read, and how
    (``("context_length", "n_depth + n_gen = 0 + 128")``).
    """

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
    phase: Phase = "decode"
    prompt_tokens: int | None = None
    derived: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class LogIssue:
    """A rejected file or row, or a warning; enough to find the cell in an editor and fix it.

    ``record`` is the 1-based position of the record in its file, set where several records share a line
    (a minified JSON array), so each can be told apart.
    """

    file_name: str
    line: int | None
    column: str | None
    value: str | None
    severity: Severity
    message: str
    record: int | None = None

    def describe(self) -> str:
        """One line for a CLI or a UI banner: ``file:line, column 'x', value '…': reason``."""
        where = self.file_name if self.line is None else f"{self.file_name}:{self.line}"
        if self.record is not None:
            where += f" (record {self.record})"
        parts = [where]
        if self.column is not None:
            parts.append(f"column {self.column!r}")
        if self.value is not None:
            parts.append(f"value {self.value!r}")
        return f"{self.severity}: {', '.join(parts)}: {self.message}"


@dataclass(frozen=True, slots=True)
class FileReport:
    """What happened to one file: its detected format, how many records went where, and what was derived.

    ``duplicate_of`` names an earlier file with the same bytes (same ``sha256``); its records are counted
    there, once. ``derived`` lists each derivation used in the file, once (``"phase: from test"``).
    """

    file_name: str
    format: str | None
    accepted: bool
    n_records: int
    n_accepted: int
    n_rejected: int
    n_skipped: int
    sha256: str = ""
    duplicate_of: str | None = None
    derived: tuple[str, ...] = ()


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

    def by_phase(self, phase: Phase) -> tuple[Measurement, ...]:
        return tuple(m for m in self.measurements if m.phase == phase)

    def raise_if_rejected(self) -> None:
        """Raise ``LogValidationError`` listing the file-level errors, if any file was rejected whole."""
        rejected = set(self.rejected_files)
        if rejected:
            raise LogValidationError([i for i in self.errors if i.file_name in rejected])

    def measurements_frame(self) -> pd.DataFrame:
        """Accepted rows, one column per Measurement field (``derived`` as ``field: how; …`` text); unknown
        columns expanded by name (prefixed ``extra:`` when a name would shadow a field, e.g. ``line``)."""
        base = [f.name for f in fields(Measurement) if f.name != "extra"]
        records = []
        extra_names: dict[str, None] = {}
        for m in self.measurements:
            row: dict[str, object] = {name: getattr(m, name) for name in base}
            row["derived"] = "; ".join(f"{k}: {v}" for k, v in m.derived) or None
            for key, value in m.extra:
                name = f"extra:{key}" if key in base else key
                extra_names.setdefault(name, None)
                row[name] = value
            records.append(row)
        frame = pd.DataFrame.from_records(records, columns=base + list(extra_names))
        for column in ("context_length", "prompt_tokens"):
            frame[column] = frame[column].astype("Int64")
        frame["tok_per_s"] = frame["tok_per_s"].astype("float64")
        frame["line"] = frame["line"].astype("int64")
        return frame

    def issues_frame(self) -> pd.DataFrame:
        """Every issue, one row each (line and record are nullable: file-level issues have none)."""
        columns = [f.name for f in fields(LogIssue)]
        frame = pd.DataFrame.from_records(
            [{c: getattr(i, c) for c in columns} for i in self.issues], columns=columns
        )
        frame["line"] = frame["line"].astype("Int64")
        frame["record"] = frame["record"].astype("Int64")
        return frame
