"""Gates 4 and 5: every reader's rows, text still, become ``Measurement`` records or row errors.

Per row, in order: labels normalised (NFKC + invisible characters removed, with a warning when that changed
anything); device/build filled from the user's labels, else from the file name when the format carries none;
cell syntax (``tok_per_s`` a plain decimal, counts whole numbers); then typed checks with a pandera schema
(finite, inside the accepted ranges, a known phase, non-empty labels). A failed check rejects that record only,
with its line, column, value and reason. Formula-like text is kept verbatim, never evaluated, and flagged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd
import pandera.pandas as pa

from analyzer.measure.logs.cells import formula_like, parse_count, parse_decimal
from analyzer.measure.logs.records import (
    LABEL_COLUMNS,
    PHASES,
    TEXT_COLUMNS,
    TOK_PER_S_RANGE,
    TOKEN_COUNT_MAX,
    Measurement,
    Phase,
)
from analyzer.measure.logs.rows import Collector, RawRow, RejectError
from analyzer.measure.logs.text import invisible_characters, normalize_label

FORMULA_WARNING = ("formula-like text kept verbatim, never evaluated; CSV downloads write it with a leading "
                   "apostrophe (') so a spreadsheet shows it as text")
DEFAULT_PHASE_NOTE = "default: a row of qfold's table without a phase is a decode run"


@dataclass(frozen=True, slots=True)
class LabelDefaults:
    """Device and build labels for rows that lack them (CLI ``--device`` / ``--label``, the upload page's
    fields); ``file_label`` stands in where the user gave none and the format carries none."""

    file_label: str
    device: str | None = None
    build: str | None = None

    def given(self, column: str) -> str | None:
        return self.device if column == "device" else self.build


def _no_line_break(series: pd.Series) -> pd.Series:
    return ~series.str.contains(r"[\r\n]", regex=True)


def _in_tok_range(series: pd.Series) -> pd.Series:
    lo, hi = TOK_PER_S_RANGE
    # Non-finite and non-positive values fail their own checks; one message per cell.
    return ~np.isfinite(series) | (series <= 0) | ((series >= lo) & (series <= hi))


_LO, _HI = TOK_PER_S_RANGE
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
            pa.Check(_in_tok_range, error=(
                f"tok_per_s is outside the accepted range {_LO:g} to {_HI:,.0f} tok/s: below it a token takes "
                "over 1,000 s, above it is ~10x beyond any published prefill rate, and the bandwidth model's "
                "arithmetic (1/tok_per_s, BW x seconds) would overflow or read back 0 bytes/token")),
        ], nullable=True),
        "context_length": pa.Column("Int64", [
            pa.Check.gt(0, error="context_length must be > 0"),
            pa.Check.le(TOKEN_COUNT_MAX, error=(
                f"context_length is over {TOKEN_COUNT_MAX:,} tokens, beyond any published context window")),
        ], nullable=True),
        "prompt_tokens": pa.Column("Int64", [
            pa.Check.ge(0, error="prompt_tokens must be >= 0"),
            pa.Check.le(TOKEN_COUNT_MAX, error=(
                f"prompt_tokens is over {TOKEN_COUNT_MAX:,} tokens, beyond any published context window")),
        ], nullable=True),
        "phase": pa.Column(str, pa.Check.isin(PHASES, error=f"phase must be one of {', '.join(PHASES)}")),
    },
    strict=True,
    name="qfold device measurements",
)
"""Typed checks of the parsed columns; index = the row's record number in its file."""


def _labels(row: RawRow, labels: LabelDefaults, col: Collector,
            missing_warned: set[str]) -> tuple[dict[str, str | None], list[tuple[str, str]]]:
    """Normalised text cells, device/build filled where the row lacks them, and what was derived."""
    stored: dict[str, str | None] = {}
    derived: list[tuple[str, str]] = []
    for column in TEXT_COLUMNS:
        raw = row.cells.get(column)
        if raw is None:
            continue
        value = normalize_label(raw)
        if value != raw.strip():
            hidden = invisible_characters(raw)
            what = (f"invisible character(s) removed ({', '.join(hidden)})" if hidden
                    else "Unicode compatibility characters folded (NFKC)")
            col.row_warning(row, row.source.get(column, column), raw, f"{what}: stored as {value!r}")
        stored[column] = value or None
    for column in LABEL_COLUMNS:
        if stored.get(column):
            continue
        given = labels.given(column)
        if given:
            stored[column] = given
            derived.append((column, f"the {column} label given for rows without one"))
        elif column not in row.cells:
            stored[column] = labels.file_label
            derived.append((column, f"the file name stands in (this format names no {column})"))
            if column not in missing_warned:
                missing_warned.add(column)
                col.add(None, column, None, "warning",
                        f"this format names no {column}: the file name {labels.file_label!r} stands in; set a "
                        f"{column} label to replace it")
    return stored, derived


def validate(rows: Sequence[RawRow], col: Collector, labels: LabelDefaults) -> list[Measurement]:
    """Rows → accepted Measurements; every refusal is added to ``col`` against its record."""
    if not rows:
        return []
    missing_warned: set[str] = set()
    stored_rows: list[dict[str, str | None]] = []
    derived_rows: list[list[tuple[str, str]]] = []
    tok: list[float] = []
    counts: dict[str, list[int | None]] = {"context_length": [], "prompt_tokens": []}
    phases: list[str] = []
    for row in rows:
        stored, derived = _labels(row, labels, col, missing_warned)
        stored_rows.append(stored)
        text = row.cells.get("tok_per_s", "")
        if not text.strip():
            col.row_error(row, row.source.get("tok_per_s", "tok_per_s"), text, "missing: tok_per_s is required")
            tok.append(math.nan)
        else:
            try:
                tok.append(parse_decimal(text, "tok_per_s"))
            except ValueError as e:
                col.row_error(row, row.source.get("tok_per_s", "tok_per_s"), text, str(e))
                tok.append(math.nan)
        for column, values in counts.items():
            value, reason = parse_count(row.cells.get(column, ""), column)
            if reason:
                col.row_error(row, row.source.get(column, column), row.cells[column], reason)
            values.append(value)
        phase_text = row.cells.get("phase", "").strip()
        if phase_text:
            phases.append(phase_text.casefold())
        else:
            phases.append("decode")
            derived.append(("phase", DEFAULT_PHASE_NOTE))
        derived_rows.append(list(row.derived) + derived)

    by_record = {row.record: row for row in rows}
    frame = pd.DataFrame(
        {
            "device": pd.Series([s.get("device") or "" for s in stored_rows], dtype=str),
            "build": pd.Series([s.get("build") or "" for s in stored_rows], dtype=str),
            "tok_per_s": pd.Series(tok, dtype="float64"),
            "context_length": pd.Series(counts["context_length"], dtype="Int64"),
            "prompt_tokens": pd.Series(counts["prompt_tokens"], dtype="Int64"),
            "phase": pd.Series(phases, dtype=str),
        }
    )
    frame.index = pd.Index([row.record for row in rows], name="record")
    try:
        MEASUREMENT_SCHEMA.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as e:
        for failure in e.failure_cases.itertuples(index=False):
            if pd.isna(failure.index):  # a column-level failure: our own frame is malformed
                raise RejectError(f"internal schema check failed: {failure.check}") from e
            row = by_record[int(failure.index)]
            column = str(failure.column)
            col.row_error(row, row.source.get(column, column), row.cells.get(column), str(failure.check))

    measurements = []
    for row, stored, derived, tok_per_s, context_length, prompt_tokens, phase in zip(
            rows, stored_rows, derived_rows, tok, counts["context_length"], counts["prompt_tokens"], phases,
            strict=True):
        extra = tuple((k, normalize_label(v)) for k, v in row.extra)
        for column, value in stored.items():
            if value is not None and formula_like(value):
                col.row_warning(row, row.source.get(column, column), value, FORMULA_WARNING)
        for key, value in extra:
            if formula_like(value):
                col.row_warning(row, key, value, FORMULA_WARNING)
        if row.record in col.rejected_records:
            continue
        measurements.append(Measurement(
            file_name=col.file_name,
            line=row.line,
            device=stored["device"] or "",
            build=stored["build"] or "",
            tok_per_s=float(tok_per_s),
            prompt_id=stored.get("prompt_id"),
            context_length=context_length,
            quantization=stored.get("quantization"),
            compute_units=stored.get("compute_units"),
            os_version=stored.get("os_version"),
            date=stored.get("date"),
            notes=stored.get("notes"),
            extra=extra,
            phase=cast(Phase, phase),  # the schema refused any other value
            prompt_tokens=prompt_tokens,
            derived=tuple(derived),
        ))
    return measurements

