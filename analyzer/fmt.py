"""Formatting at the edge (CLI tables, UI labels, exports). Values inside qfold stay ints in bytes."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence

MIB = 1 << 20  # MiB = 2^20 bytes
MB = 1_000_000  # MB = 10^6 bytes (the write-up's unit for bandwidth and bytes per token)
UNITS: dict[str, int] = {"B": 1, "KiB": 1 << 10, "MiB": MIB, "GiB": 1 << 30, "kB": 1_000, "MB": MB, "GB": 10**9}


def size(n_bytes: int | float, unit: str = "MiB", digits: int = 1, *, sign: bool = False,
         suffix: bool = True) -> str:
    """The one size formatter: ``size(16_777_216)`` → ``16.0 MiB``; ``sign`` adds ``+``/``-``; ``suffix``
    False leaves the unit off (for ``a → b MiB`` pairs)."""
    if unit not in UNITS:
        raise ValueError(f"unit {unit!r}: choose one of {', '.join(UNITS)}")
    text = f"{n_bytes / UNITS[unit]:{'+' if sign else ''},.{digits}f}"
    return f"{text} {unit}" if suffix else text


def mib(n_bytes: int | float, digits: int = 1, **kwargs) -> str:
    return size(n_bytes, "MiB", digits, **kwargs)


def mb(n_bytes: int | float, digits: int = 1, **kwargs) -> str:
    return size(n_bytes, "MB", digits, **kwargs)


def change(a: int | float, b: int | float, unit: str = "MiB", digits: int = 0) -> str:
    """``960 → 0 MiB``."""
    return f"{size(a, unit, digits, suffix=False)} → {size(b, unit, digits)}"


def bandwidth(bytes_per_s: float, digits: int = 0) -> str:
    """``55,900 MB/s`` (MB = 10^6 bytes)."""
    return f"{size(bytes_per_s, 'MB', digits, suffix=False)} MB/s"


def gflop(flops: int | float, digits: int = 2) -> str:
    """``3.59 GFLOP`` (GFLOP = 10^9 floating-point operations)."""
    return f"{flops / 1e9:,.{digits}f} GFLOP"


def bytes_both(n_bytes: int) -> str:
    """``16.0 MiB (16,777,216 B)``: the readable figure and the exact count it came from."""
    return f"{mib(n_bytes)} ({n_bytes:,} B)"


def layer_ranges(layers: Iterable[int]) -> str:
    """{0, 1, 2, 3, 26, 27} → ``0-3,26-27``."""
    xs = sorted(set(layers))
    runs: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        runs.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(runs)


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
