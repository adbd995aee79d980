"""What readers hand to validation: records mapped onto qfold's columns (still text), and the collector of
issues for one file. Internal to the package."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from analyzer.measure.logs.records import VALUE_PREVIEW_CHARS, LogIssue, Severity


class RejectError(Exception):
    """A file-level error found while reading; the importer turns it into the file's one error."""

    def __init__(self, message: str, line: int | None = None, column: str | None = None,
                 value: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column
        self.value = value


@dataclass(frozen=True, slots=True)
class RawRow:
    """One record mapped onto qfold's columns, as text.

    ``record`` (1-based, in file order) is the row's identity: several records can share a line (a minified
    JSON array), so a rejection is tracked per record, never per line. ``source`` says which file column or
    line each cell came from (for messages); ``derived`` says how a computed cell was computed.
    ``cells`` lacks ``device``/``build`` entirely when the format carries none (the labels fill them).
    """

    line: int
    record: int
    cells: Mapping[str, str]
    source: Mapping[str, str]
    extra: tuple[tuple[str, str], ...] = ()
    derived: tuple[tuple[str, str], ...] = ()
    shared_line: bool = False


def preview(value: str | None) -> str | None:
    if value is None or len(value) <= VALUE_PREVIEW_CHARS:
        return value
    return value[: VALUE_PREVIEW_CHARS - 1] + "…"


@dataclass(slots=True)
class Collector:
    """Mutable scratch space for one file while it is read: issues, counts, the detected format."""

    file_name: str
    issues: list[LogIssue] = field(default_factory=list)
    n_records: int = 0
    n_skipped: int = 0
    header_line: int = 1
    format: str | None = None
    rejected_records: set[int] = field(default_factory=set)

    def next_record(self) -> int:
        """Count one more record and return its 1-based number."""
        self.n_records += 1
        return self.n_records

    def add(self, line: int | None, column: str | None, value: str | None, severity: Severity,
            message: str, *, record: int | None = None, shared_line: bool = False) -> None:
        """Record an issue; an error with a ``record`` rejects that record."""
        self.issues.append(LogIssue(self.file_name, line, column, preview(value), severity, message,
                                    record if shared_line else None))
        if severity == "error" and record is not None:
            self.rejected_records.add(record)

    def row_error(self, row: RawRow, column: str | None, value: str | None, message: str) -> None:
        self.add(row.line, column, value, "error", message, record=row.record, shared_line=row.shared_line)

    def row_warning(self, row: RawRow, column: str | None, value: str | None, message: str) -> None:
        self.add(row.line, column, value, "warning", message, record=row.record, shared_line=row.shared_line)


def mapped(cells: Mapping[str, tuple[str, str]]) -> tuple[dict[str, str], dict[str, str]]:
    """``{column: (text, source)}`` → the ``cells`` and ``source`` dicts of a RawRow."""
    return {k: v for k, (v, _) in cells.items()}, {k: s for k, (_, s) in cells.items()}
