"""Gate 3 for tables: CSV and markdown tables split into a header and records, before any value is read.

CSV goes through Python's ``csv`` module (strict) and pandas never parses it, so two CSV parsers cannot
disagree about where a field ends. Every record's field count is checked against the header: a ragged row is
rejected by its line number, never re-aligned. Markdown tables (``| a | b |`` rows under a ``|---|`` separator,
as llama-bench prints them and as they are pasted into GitHub issues, optionally behind ``#`` or ``>``) go
through the same checks.
"""

from __future__ import annotations

import csv
import io
import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from analyzer.measure.logs.records import KNOWN_COLUMNS, LogLimits
from analyzer.measure.logs.rows import Collector, RejectError, preview
from analyzer.measure.logs.text import normalize_label


@dataclass(slots=True)
class Table:
    """A header and its well-formed records ``(line, record number, fields)``; ``notes`` holds text lines
    found right after a markdown table (llama-bench's ``build: <commit> (<n>)`` footer)."""

    header: list[str]
    header_line: int
    rows: list[tuple[int, int, list[str]]]
    notes: list[tuple[int, str]] = field(default_factory=list)


def normalize_header(cells: list[str], line: int) -> list[str]:
    """Names stripped and normalised, qfold's known columns in their canonical case; an empty or
    duplicate name rejects the file (a value could otherwise land under the wrong name)."""
    names = [normalize_label(cell) for cell in cells]
    for index, name in enumerate(names):
        if not name:
            raise RejectError(f"header column {index + 1} has no name (a trailing separator?)", line=line)
    known = {name.casefold(): name for name in KNOWN_COLUMNS}
    canonical = [known.get(name.casefold(), name) for name in names]
    seen: dict[str, int] = {}
    for index, name in enumerate(canonical):
        key = name.casefold()
        if key in seen:
            raise RejectError(f"duplicate column name (columns {seen[key] + 1} and {index + 1})", line=line,
                              column=names[index])
        seen[key] = index
    return canonical


def _check_shape(header: list[str], header_line: int, good: list[tuple[int, int, list[str]]],
                 ragged: list[tuple[int, int, list[str]]], blank_lines: list[int], separator: str,
                 col: Collector) -> None:
    # Blank lines after the last record are the usual file ending; interior ones are reported.
    last_data_line = max([line for line, _, _ in good] + [line for line, _, _ in ragged], default=0)
    for line in blank_lines:
        if header_line < line < last_data_line:
            col.add(line, None, None, "warning", "blank line ignored")
    if not good and not ragged:
        raise RejectError("the table has a header but no data rows", line=header_line)
    if ragged and not good and len({len(fields) for _, _, fields in ragged}) == 1:
        n = len(ragged[0][2])
        raise RejectError(f"every data row has {n} fields but the header has {len(header)}: a column name "
                          "is missing from the header, or the rows are shifted (an index column?)",
                          line=ragged[0][0])
    for line, record, fields in ragged:
        col.add(line, None, separator.join(fields), "error",
                f"row has {len(fields)} fields but the header has {len(header)}; the row is rejected rather "
                "than re-aligned (a decimal comma or an unquoted separator in text?)", record=record)


def _check_limits(fields: list[str], header: list[str] | None, line: int, n_rows: int, limits: LogLimits) -> None:
    if fields and max(map(len, fields)) > limits.max_field_chars:
        index, cell = next((i, c) for i, c in enumerate(fields) if len(c) > limits.max_field_chars)
        name = header[index] if header is not None and index < len(header) else f"#{index + 1}"
        raise RejectError(f"field is {len(cell):,} characters, over the limit of {limits.max_field_chars:,}",
                          line=line, column=name, value=preview(cell))
    if header is None and len(fields) > limits.max_columns:
        raise RejectError(f"header has {len(fields):,} columns, over the limit of {limits.max_columns}", line=line)
    if header is not None and n_rows >= limits.max_rows:
        raise RejectError(f"more than {limits.max_rows:,} data rows (limit); split the file", line=line)


def _is_blank(record: list[str]) -> bool:
    return len(record) <= 1 and not (record and record[0].strip())


def read_csv_table(text: str, limits: LogLimits, col: Collector,
                   header_check: Callable[[list[str], int], None] | None = None) -> Table:
    """The CSV header and its records; ragged records are reported (and counted), not returned.

    ``header_check(names, line)`` runs on the header before any row is judged, so a file missing a required
    column is told so, not that its rows do not fit a header that was never meant as one.
    """
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    header_line = 1
    good: list[tuple[int, int, list[str]]] = []
    ragged: list[tuple[int, int, list[str]]] = []
    blank_lines: list[int] = []
    previous_end = 0
    try:
        for fields in reader:
            start = previous_end + 1
            previous_end = reader.line_num
            if _is_blank(fields):
                blank_lines.append(start)
                continue
            _check_limits(fields, header, start, len(good) + len(ragged), limits)
            if header is None:
                header, header_line = fields, start
                col.header_line = start
                continue
            record = col.next_record()
            (good if len(fields) == len(header) else ragged).append((start, record, fields))
    except csv.Error as e:
        # Reported at the line the broken record starts on: an unclosed quote runs to the end of file.
        start = previous_end + 1
        # The csv module stops at its own field limit (131,072 chars) before ours can be checked.
        if "field limit" in str(e):
            raise RejectError(f"a field is longer than {csv.field_size_limit():,} characters (limit "
                              f"{limits.max_field_chars:,})", line=start) from e
        raise RejectError(f"malformed CSV in the record starting on this line: {e}", line=start) from e
    if header is None:  # e.g. only '""' lines: not whitespace to decode(), but no field either
        raise RejectError("no header row: every line is blank")
    if header_line != 1:
        col.add(None, None, None, "warning", f"header found on line {header_line}; lines above it are blank")
    names = normalize_header(header, header_line)
    if len(names) == 1 and ";" in names[0]:
        raise RejectError("the header is one column containing ';': semicolon-separated files are not "
                          "accepted; export with commas", line=header_line, value=names[0])
    if header_check is not None:
        header_check(names, header_line)
    _check_shape(names, header_line, good, ragged, blank_lines, ",", col)
    return Table(names, header_line, good)


# ---------------------------------------------------------------------------------------------
# Markdown

# A table line, optionally behind a comment or quote prefix ("# | a |", "> | a |" in a GitHub reply).
_MD_ROW = re.compile(r"^\s*(?:[#>]\s*)*(\|.*\|)\s*$")
_MD_ROW_START = re.compile(r"^\s*(?:[#>]\s*)*\|")
_MD_SEPARATOR_CELL = re.compile(r"\s*:?-{1,}:?\s*")


def _md_cells(row: str) -> list[str]:
    """``| a | b \\| c |`` → ``['a', 'b | c']``: split on unescaped pipes, outer pipes dropped."""
    inner = row.strip()[1:-1]
    return [cell.replace("\\|", "|").strip() for cell in re.split(r"(?<!\\)\|", inner)]


def _is_separator(line: str) -> bool:
    match = _MD_ROW.match(line)
    return bool(match) and all(_MD_SEPARATOR_CELL.fullmatch(c) for c in _md_cells(match.group(1)))


def markdown_headers(text: str) -> list[list[str]]:
    """The header cells of every markdown table: a row directly followed by a separator row (``|---|---:|``)."""
    lines = text.splitlines()
    return [_md_cells(row.group(1)) for a, b in itertools.pairwise(lines)
            if (row := _MD_ROW.match(a)) and not _is_separator(a) and _is_separator(b)]


def read_markdown_tables(text: str, limits: LogLimits, col: Collector) -> list[Table]:
    """Every markdown table in the text, each with its own header; lines between tables are kept as the
    preceding table's ``notes`` (llama-bench prints ``build: <commit> (<n>)`` under its table)."""
    lines = text.splitlines()
    tables: list[Table] = []
    current: Table | None = None
    ragged: list[tuple[int, int, list[str]]] = []
    blank_lines: list[int] = []
    n_rows = 0
    index = 0

    def close() -> None:
        if current is not None:
            good = current.rows
            _check_shape(current.header, current.header_line, good, ragged, blank_lines, " | ", col)

    while index < len(lines):
        line_no, line = index + 1, lines[index]
        row = _MD_ROW.match(line)
        if row and index + 1 < len(lines) and not _is_separator(line) and _is_separator(lines[index + 1]):
            close()
            header_cells = _md_cells(row.group(1))
            _check_limits(header_cells, None, line_no, 0, limits)
            current = Table(normalize_header(header_cells, line_no), line_no, [])
            tables.append(current)
            ragged, blank_lines = [], []
            index += 2
            continue
        if current is not None and row and not _is_separator(line):
            fields = _md_cells(row.group(1))
            _check_limits(fields, current.header, line_no, n_rows, limits)
            n_rows += 1
            record = col.next_record()
            target = current.rows if len(fields) == len(current.header) else ragged
            target.append((line_no, record, fields))
        elif current is not None and _MD_ROW_START.match(line):
            record = col.next_record()
            col.add(line_no, None, line.strip(), "error", "table row without its closing '|': the row is cut "
                    "short or a cell holds a line break", record=record)
        elif current is not None and not line.strip():
            blank_lines.append(line_no)
        elif current is not None:
            current.notes.append((line_no, line.strip().lstrip("#>").strip()))
        index += 1
    close()
    if not tables:
        raise RejectError("no markdown table (a | header | row followed by a |---| separator row)")
    return tables
