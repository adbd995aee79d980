"""Gate 4, cell syntax: what a number in a log may look like. Shared by every reader and the validator."""

from __future__ import annotations

import re

from analyzer.fmt import csv_safe

# ASCII digits only: float() would also take "٣١" or "３１", which no benchmark tool writes.
NUMBER = r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
PLAIN_NUMBER = re.compile(NUMBER)
_NUMBER_WITH_UNIT = re.compile(rf"({NUMBER})\s*([^0-9\s.,].*)")
_NAMED_FLOATS = {"nan": "NaN is not a measurement", "-nan": "NaN is not a measurement", "inf": None,
                 "+inf": None, "-inf": None, "infinity": None, "+infinity": None, "-infinity": None}
_INT64_MAX = 2**63 - 1


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
    if PLAIN_NUMBER.fullmatch(s):
        return float(s)
    if "," in s and re.fullmatch(r"[-+]?[0-9.,]+", s):
        raise ValueError("decimal commas (and thousands separators) are not accepted; write 31.2, not 31,2")
    if re.fullmatch(r"[-+]?[0-9_.]+", s):
        raise ValueError("digit separators are not accepted; write the plain number")
    unit = _NUMBER_WITH_UNIT.fullmatch(s)
    if unit:
        raise ValueError(f"units are not accepted in the cell ({unit.group(2)!r}); {what} takes a plain number")
    raise ValueError("not a number")


def parse_count(text: str, what: str) -> tuple[int | None, str | None]:
    """A whole number of tokens ("4096"; sign allowed so that "-5" is refused by range, not syntax), or the
    reason the text is not one. Empty text is no value, not an error."""
    s = text.strip()
    if not s:
        return None, None
    if re.fullmatch(r"[-+]?[0-9]+", s):
        if len(s.lstrip("+-")) > 19:  # beyond int64 anyway; int() of > 4,300 digits raises a bare ValueError
            return None, f"{what} is out of range"
        value = int(s)
        if abs(value) > _INT64_MAX:
            return None, f"{what} is out of range"
        return value, None
    if re.fullmatch(r"[-+]?[0-9]+\.[0-9]*", s):
        return None, f"{what} must be a whole number of tokens"
    if _NUMBER_WITH_UNIT.fullmatch(s):
        return None, "units or suffixes (k, tokens) are not accepted; write 4096"
    return None, f"{what} must be a non-negative whole number"


def nonneg_int(text: str) -> int | None:
    """Digits only, at most 18 of them (an int64 without overflow), else None."""
    s = text.strip()
    return int(s) if re.fullmatch(r"[0-9]{1,18}", s) else None


def formula_like(stored: str) -> bool:
    """True when ``fmt.csv_safe`` will prefix the stored text with an apostrophe on CSV export, except a
    plain signed number ("-1"), which is data. Judged on the stored (stripped, normalised) value, so the
    warning and the export always agree."""
    return csv_safe(stored) != stored and not PLAIN_NUMBER.fullmatch(stored)
