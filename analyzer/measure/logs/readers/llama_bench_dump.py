"""llama-bench's machine formats: JSON (``-o json``), JSONL (``-o jsonl``) and SQL (``-o sql``). Each record is read
into llama-bench's own fields and handed to the one mapping in ``llama_bench`` (its docstring cites the source),
one record at a time, so a bad record costs only itself."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator

from analyzer.fsio import IntegerTooLongError, bounded_int
from analyzer.measure.logs.readers.llama_bench import REQUIRED_FIELDS, check_fields, map_result
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError
from analyzer.measure.logs.text import LineCounter, line_of_offset

# ---------------------------------------------------------------------------------------------
# JSON (-o json: one array) and JSONL (-o jsonl: one object per line)


def _json_text(value: object) -> str:
    """A JSON value as the text a CSV cell would hold (strings verbatim, the rest as JSON)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, allow_nan=True)
    except (RecursionError, ValueError):
        return "<a value nested too deeply to show>"


def _json_array_items(text: str) -> Iterator[tuple[int, object]]:
    """Elements of a top-level JSON array with the line each starts on (json gives no positions)."""
    decoder = json.JSONDecoder(parse_int=bounded_int)
    ws = re.compile(r"\s*")
    pos = ws.match(text, 0).end()  # type: ignore[union-attr]
    pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]  # past '['
    line_of = LineCounter(text)
    if text.startswith("]", pos):
        end = pos + 1
    else:
        while True:
            value, end = decoder.raw_decode(text, pos)
            yield line_of(pos), value
            pos = ws.match(text, end).end()  # type: ignore[union-attr]
            if text.startswith(",", pos):
                pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]
                continue
            if text.startswith("]", pos):
                end = pos + 1
                break
            raise RejectError("expected ',' or ']' between array elements", line=line_of_offset(text, pos))
    if text[end:].strip():
        raise RejectError("text after the closing ']'", line=line_of_offset(text, end))


def _objects(items: list[tuple[int, object]], limits: LogLimits, col: Collector,
             shared: set[int]) -> list[RawRow]:
    keys = {k for _, item in items if isinstance(item, dict) for k in item}
    if not set(REQUIRED_FIELDS) <= keys:
        raise RejectError("JSON logs are accepted only as llama-bench output (-o json / -o jsonl); no result has "
                          f"all of {', '.join(REQUIRED_FIELDS)}. Use CSV for qfold's schema")
    rows = []
    for line, item in items:
        record = col.next_record()
        on_shared = line in shared

        def error(column: str | None, value: str | None, message: str) -> None:
            col.add(line, column, value, "error", message, record=record, shared_line=on_shared)  # noqa: B023

        if not isinstance(item, dict):
            error(None, _json_text(item), f"expected a llama-bench result object, got a JSON {type(item).__name__}")
            continue
        if len(item) > limits.max_columns:
            error(None, None, f"result has {len(item)} fields, over the limit of {limits.max_columns}")
            continue
        cells = {str(k): _json_text(v) for k, v in item.items()}
        too_long = next((k for k, v in cells.items() if len(v) > limits.max_field_chars), None)
        if too_long is not None:
            error(too_long, cells[too_long], f"field is {len(cells[too_long]):,} characters, over the limit of "
                  f"{limits.max_field_chars:,}")
            continue
        missing = [k for k in REQUIRED_FIELDS if k not in cells]
        if missing:
            error(", ".join(missing), None, "llama-bench result without this field")
            continue
        row = map_result(line, record, cells, col, shared_line=on_shared)
        if row is not None:
            rows.append(row)
    return rows


def _too_many(count: int, limits: LogLimits, line: int) -> None:
    if count > limits.max_rows:
        raise RejectError(f"more than {limits.max_rows:,} results (limit); split the file", line=line)


def read_json(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    """``-o json``: a syntax error anywhere rejects the file (the array cannot be resynchronised); a bad
    result object rejects that object only, also when every object shares one line (minified JSON)."""
    items: list[tuple[int, object]] = []
    try:
        for line, value in _json_array_items(text):
            items.append((line, value))
            _too_many(len(items), limits, line)
    except json.JSONDecodeError as e:
        raise RejectError(f"invalid JSON: {e.msg}", line=e.lineno) from e
    except IntegerTooLongError as e:
        raise RejectError(f"invalid JSON: {e}") from e
    except RecursionError as e:
        raise RejectError("JSON is nested too deeply to be a llama-bench result") from e
    if not items:
        raise RejectError("JSON array is empty: no results")
    per_line = Counter(line for line, _ in items)
    return _objects(items, limits, col, {line for line, n in per_line.items() if n > 1})


def read_jsonl(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    """``-o jsonl``: one object per line; a line that is not valid JSON rejects that line only."""
    items: list[tuple[int, object]] = []
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        _too_many(len(items) + 1, limits, line)
        try:
            items.append((line, json.loads(raw, parse_int=bounded_int)))
        except json.JSONDecodeError as e:
            col.add(line, None, raw, "error", f"invalid JSON on this line: {e.msg} (column {e.colno})",
                    record=col.next_record())
        except IntegerTooLongError as e:
            col.add(line, None, None, "error", f"invalid JSON on this line: {e}", record=col.next_record())
        except RecursionError:
            col.add(line, None, None, "error", "JSON on this line is nested too deeply", record=col.next_record())
    if not items:
        raise RejectError("no line of the JSONL file is valid JSON")
    return _objects(items, limits, col, set())


def detect_json(text: str) -> str | None:
    """``llama-bench-json`` for an array, ``llama-bench-jsonl`` for one object per line, else None."""
    first = text.lstrip()[:1]
    if first == "[":
        return "llama-bench-json"
    if first == "{":
        first_line = text.lstrip().splitlines()[0]
        try:
            json.loads(first_line, parse_int=bounded_int)
        except IntegerTooLongError:
            return "llama-bench-jsonl"  # its reader names the line
        except (json.JSONDecodeError, RecursionError):
            raise RejectError("a JSON object spanning several lines, not a format qfold reads: llama-bench -o json "
                              "writes an array ([...]) and -o jsonl one object per line; Core AI's llm-benchmark "
                              "report has trials, a community bench blob kind coreai-community-bench") from None
        return "llama-bench-jsonl"
    return None


# ---------------------------------------------------------------------------------------------
# SQL (-o sql): CREATE TABLE, then one INSERT per result

_INSERT_START = re.compile(r"^\s*INSERT\s+INTO\b", re.IGNORECASE)
_INSERT = re.compile(r"^\s*INSERT\s+INTO\s+[`\"\[]?\w+[`\"\]]?\s*\((?P<cols>[^)]*)\)\s*"
                     r"VALUES\s*\((?P<vals>.*)\)\s*;?\s*$", re.IGNORECASE)
_CREATE = re.compile(r"^\s*CREATE\s+TABLE\b", re.IGNORECASE)


def has_sql_inserts(text: str) -> bool:
    return any(_INSERT_START.match(line) for line in text.splitlines())


def _sql_values(text: str) -> list[str]:
    """``'a', 'it''s', 12`` → ``['a', "it's", '12']``; ValueError on an unterminated string."""
    values: list[str] = []
    pos, n = 0, len(text)
    while True:
        while pos < n and text[pos].isspace():
            pos += 1
        if pos < n and text[pos] == "'":
            pos += 1
            chunk: list[str] = []
            while True:
                end = text.find("'", pos)
                if end < 0:
                    raise ValueError("a quoted value is not closed")
                chunk.append(text[pos:end])
                if text.startswith("''", end):
                    chunk.append("'")
                    pos = end + 2
                    continue
                pos = end + 1
                break
            values.append("".join(chunk))
        else:
            end = text.find(",", pos)
            end = n if end < 0 else end
            values.append(text[pos:end].strip())
            pos = end
        while pos < n and text[pos].isspace():
            pos += 1
        if pos >= n:
            return values
        if text[pos] != ",":
            raise ValueError(f"expected ',' between values at {text[pos:pos + 20]!r}")
        pos += 1


def read_sql(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    rows: list[RawRow] = []
    names_seen: set[str] = set()
    in_create = False
    for line, raw in enumerate(text.splitlines(), start=1):
        if in_create:
            in_create = ");" not in raw
            continue
        if _CREATE.match(raw):
            in_create = ");" not in raw
            continue
        if not raw.strip():
            continue
        if not _INSERT_START.match(raw):
            col.add(line, None, raw.strip(), "warning", "not an INSERT statement: line ignored")
            continue
        record = col.next_record()
        if record > limits.max_rows:
            raise RejectError(f"more than {limits.max_rows:,} results (limit); split the file", line=line)
        match = _INSERT.match(raw)
        if not match:
            col.add(line, None, raw.strip(), "error", "malformed INSERT statement: expected INSERT INTO t (columns) "
                    "VALUES (values);", record=record)
            continue
        names = [name.strip().strip('`"[]') for name in match["cols"].split(",")]
        try:
            values = _sql_values(match["vals"])
        except ValueError as e:
            col.add(line, None, match["vals"], "error", f"malformed VALUES: {e}", record=record)
            continue
        if len(values) != len(names):
            col.add(line, None, match["vals"], "error", f"INSERT has {len(values)} values for {len(names)} "
                    "columns; the record is rejected rather than re-aligned", record=record)
            continue
        if len(names) > limits.max_columns:
            raise RejectError(f"INSERT has {len(names)} columns, over the limit of {limits.max_columns}", line=line)
        names_seen |= set(names)
        cells = dict(zip(names, values, strict=True))
        missing = [f for f in REQUIRED_FIELDS if f not in cells]
        if missing:
            col.add(line, ", ".join(missing), None, "error", "llama-bench result without this field", record=record)
            continue
        row = map_result(line, record, cells, col)
        if row is not None:
            rows.append(row)
    if col.n_records == 0:
        raise RejectError("no INSERT statement")
    if names_seen and not set(REQUIRED_FIELDS) <= names_seen:
        check_fields(names_seen, None)
    return rows
