"""Formatting at the edge (CLI tables, UI labels, exports). Values inside qfold stay ints in bytes."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence

MIB = 1 << 20
MB = 1_000_000


def mib(n_bytes: int | float) -> str:
    return f"{n_bytes / MIB:,.1f} MiB"


def mb(n_bytes: int | float) -> str:
    return f"{n_bytes / MB:,.1f} MB"


def bytes_both(n_bytes: int) -> str:
    """``16.0 MiB (16,777,216 B)``: the readable figure and the exact count it came from."""
    return f"{mib(n_bytes)} ({n_bytes:,} B)"


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    """A plain fixed-width text table; numbers right-aligned."""
    cells = [[str(h) for h in header]] + [["" if c is None else f"{c:,}" if isinstance(c, int) else str(c)
                                           for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    numeric = [all(isinstance(r[i], (int, float)) or r[i] is None for r in rows) for i in range(len(header))]
    lines = []
    for j, r in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if numeric[i] and j else c.ljust(w) for i, (c, w) in
                               enumerate(zip(r, widths, strict=True))).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


_FORMULA_START = ("=", "+", "-", "@", "|", "%", "\t", "\r", "\0")


def csv_safe(value: object) -> object:
    """Neutralise spreadsheet formula injection: a text cell starting with = + - @ | %, a tab, CR or NUL
    gets a leading apostrophe (OWASP "CSV Injection" guidance). Numbers pass unchanged."""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value.replace("\0", "")
    return value


def to_csv(rows: Iterable[dict], columns: Sequence[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([csv_safe(r.get(c)) for c in columns])
    return buf.getvalue()
