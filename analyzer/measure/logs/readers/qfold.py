"""qfold's own table schema, as CSV or as a markdown table: one row per measured run.

Required: ``tok_per_s``; ``device`` and ``build`` too unless labels are given (without them the file name
stands in, with a warning). Optional: ``prompt_id, context_length, quantization, compute_units, os_version,
date, notes, phase`` (decode | prefill | mixed; a row without one is a decode run) and ``prompt_tokens``.
Unknown columns are kept verbatim as extra fields and reported once.
"""

from __future__ import annotations

from analyzer.measure.logs.readers.tables import Table
from analyzer.measure.logs.records import KNOWN_COLUMNS
from analyzer.measure.logs.rows import Collector, RawRow, RejectError


def is_qfold_header(header: list[str]) -> bool:
    return "tok_per_s" in header


def check_header(header: list[str], line: int) -> None:
    if "tok_per_s" not in header:
        raise RejectError(f"missing required column(s) tok_per_s; the header has {', '.join(header)}. If this "
                          "is not meant as qfold's CSV: no other log format was recognised either (llama-bench "
                          "md/csv/json/jsonl/sql, llama.cpp, mlx_lm, ExecuTorch or ANEMLL runner output)",
                          line=line, column="tok_per_s")


def qfold_rows(table: Table, col: Collector) -> list[RawRow]:
    header = table.header
    check_header(header, table.header_line)
    unknown = [c for c in header if c not in KNOWN_COLUMNS]
    if unknown:
        col.add(None, ", ".join(unknown), None, "warning", "unknown column(s) kept as extra fields, not interpreted")
    known = [(i, c) for i, c in enumerate(header) if c in KNOWN_COLUMNS]
    extra = [(i, c) for i, c in enumerate(header) if c not in KNOWN_COLUMNS]
    source = {c: c for c in KNOWN_COLUMNS}  # shared: every row's cells come from these columns
    return [
        RawRow(line, record, {c: fields[i] for i, c in known}, source, tuple((c, fields[i]) for i, c in extra))
        for line, record, fields in table.rows
    ]
