"""Markdown tables, as llama-bench prints them by default and as people paste them into issues and chats.

Each table in the text is read on its own header: a llama-bench table (``test`` and ``t/s`` columns) through
the llama-bench mapping, a table in qfold's schema (a ``tok_per_s`` column) like qfold's CSV. Any other table
(a comment's own summary) is named in a warning and skipped; a text with no usable table is refused.
"""

from __future__ import annotations

from analyzer.measure.logs.readers.llama_bench import is_llama_bench_markdown, markdown_table_rows
from analyzer.measure.logs.readers.qfold import is_qfold_header, qfold_rows
from analyzer.measure.logs.readers.tables import read_markdown_tables
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError


def read(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    rows: list[RawRow] = []
    used = 0
    for table in read_markdown_tables(text, limits, col):
        if is_llama_bench_markdown(table.header):
            rows.extend(markdown_table_rows(table, col))
        elif is_qfold_header(table.header):
            rows.extend(qfold_rows(table, col))
        else:
            col.add(table.header_line, None, " | ".join(table.header), "warning",
                    "markdown table skipped: neither llama-bench's (test, t/s) nor qfold's (tok_per_s) columns")
            col.n_skipped += len(table.rows)
            continue
        used += 1
    if not used:
        raise RejectError("no markdown table with llama-bench's test and t/s columns or qfold's tok_per_s column")
    return rows
