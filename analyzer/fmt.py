"""Formatting at the edge (CLI tables, UI labels, exports). Values inside qfold stay ints in bytes."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Sequence

MIB = 1 << 20  # MiB = 2^20 bytes
MB = 1_000_000  # MB = 10^6 bytes (the write-up's unit for bandwidth and bytes per token)
UNITS: dict[str, int] = {"B": 1, "KiB": 1 << 10, "MiB": MIB, "GiB": 1 << 30, "kB": 1_000, "MB": MB, "GB": 10**9}
# The ladders ``unit="auto"`` climbs: binary (2^10 steps) or decimal (10^3 steps, the write-up's MB).
AUTO_UNITS: dict[str, tuple[str, ...]] = {"auto": ("B", "KiB", "MiB", "GiB"), "auto-si": ("B", "kB", "MB", "GB")}


def pick_unit(n_bytes: int | float, ladder: str = "auto", at_least: float = 1) -> str:
    """The largest unit of ``ladder`` in which ``n_bytes`` reads at least ``at_least`` (``B`` below that):
    32,768 → ``KiB``, 1,006,632,960 → ``MiB``, 3.2·10^9 → ``GiB``. One unit per value, so 32 KiB is never shown
    as ``0 MiB``. A table column uses the unit its largest value reads ≥ 100 in (``at_least=100``), so its
    smaller values keep their digits."""
    if ladder not in AUTO_UNITS:
        raise ValueError(f"unit ladder {ladder!r}: choose one of {', '.join(AUTO_UNITS)}")
    magnitude = abs(n_bytes)
    chosen = AUTO_UNITS[ladder][0]
    for unit in AUTO_UNITS[ladder]:
        if magnitude >= UNITS[unit] * at_least:
            chosen = unit
    return chosen


def _auto_digits(value: float, unit: str) -> int:
    """Whole bytes and zero; otherwise three significant figures up to 999 (``1.50 GiB``, ``60.0 KiB``,
    ``960 MiB``)."""
    if unit == "B" or value == 0:
        return 0
    magnitude = abs(value)
    return 2 if magnitude < 10 else 1 if magnitude < 100 else 0


def size(n_bytes: int | float, unit: str = "MiB", digits: int | None = 1, *, sign: bool = False,
         suffix: bool = True) -> str:
    """The one size formatter: ``size(16_777_216)`` → ``16.0 MiB``; ``sign`` adds ``+``/``-``; ``suffix``
    False leaves the unit off (for ``a → b MiB`` pairs).

    ``unit="auto"`` (binary) or ``"auto-si"`` picks the unit per value (:func:`pick_unit`) and, with ``digits``
    None, three significant figures: ``size(32_768, "auto", None)`` → ``32.0 KiB``. A value that rounds to zero
    is printed unsigned (never ``-0.0``)."""
    if unit in AUTO_UNITS:
        unit = pick_unit(n_bytes, unit)
    if unit not in UNITS:
        raise ValueError(f"unit {unit!r}: choose one of {', '.join((*UNITS, *AUTO_UNITS))}")
    value = n_bytes / UNITS[unit]
    if digits is None:
        digits = _auto_digits(value, unit)
    value = round(value, digits) + 0.0  # -0.0 → 0.0
    text = f"{value:{'+' if sign and value else ''},.{digits}f}"
    return f"{text} {unit}" if suffix else text


def mib(n_bytes: int | float, digits: int = 1, **kwargs) -> str:
    return size(n_bytes, "MiB", digits, **kwargs)


def mb(n_bytes: int | float, digits: int = 1, **kwargs) -> str:
    return size(n_bytes, "MB", digits, **kwargs)


def change(a: int | float, b: int | float, unit: str = "MiB", digits: int | None = 0) -> str:
    """``960 → 0 MiB``. With ``unit="auto"`` (or ``"auto-si"``) the unit fits the values: one suffix when both
    read in the same unit or one side is zero (``2.96 → 1.08 GiB``, ``32.0 → 0 KiB``), each its own otherwise
    (``960 MiB → 512 KiB``)."""
    if unit in AUTO_UNITS:
        unit_a, unit_b = pick_unit(a, unit), pick_unit(b, unit)
        if unit_a != unit_b and b and a:
            return f"{size(a, unit_a, digits)} → {size(b, unit_b, digits)}"
        unit = unit_a if a else unit_b
    return f"{size(a, unit, digits, suffix=False)} → {size(b, unit, digits)}"


def rate(tok_per_s: float) -> str:
    """A throughput with separators and the decimals its size deserves: ``365,455``, ``48.1``, ``5.43``,
    ``0.125``."""
    magnitude = abs(tok_per_s)
    digits = 0 if magnitude >= 100 else 1 if magnitude >= 10 else 2 if magnitude >= 1 else 3
    return f"{round(tok_per_s, digits) + 0.0:,.{digits}f}"


def count_change(a: int, b: int) -> str:
    """``2,521 → 2,401``."""
    return f"{a:,} → {b:,}"


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


CSV_FLOAT_DIGITS = 12  # significant digits: float64 carries ~15.9, arithmetic noise lives in the last 2-3


def csv_number(value: object) -> object:
    """A float as it should read in a CSV: at most 12 significant digits, so arithmetic noise
    (``0.30000000000000004``, ``2741.5399705738107``) never reaches a spreadsheet; ``-0.0`` is written as ``0``,
    NaN as an empty cell. Other values pass unchanged."""
    if isinstance(value, float) and not isinstance(value, bool):
        if value != value:  # NaN
            return ""
        return f"{value + 0.0:.{CSV_FLOAT_DIGITS}g}"
    return value


def to_csv(rows: Iterable[dict], columns: Sequence[str]) -> str:
    """Rows as CSV: formula-like text escaped (:func:`csv_safe`), floats without binary noise
    (:func:`csv_number`), missing values empty."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([csv_safe(csv_number(r.get(c))) for c in columns])
    return buf.getvalue()


def quoted(text: str, limit: int = 40) -> str:
    """``text`` quoted for an error message, cut to ``limit`` characters with its length said:
    ``'99999…'… (5,000 characters)``, so a refused 5,000-digit value never makes a 10 kB line."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}… ({len(text):,} characters)"


def md(text: object) -> str:
    """``text`` (a URL parameter, a file name, a label, a path, an op name) for a Streamlit markdown surface
    (``st.markdown``, ``st.caption``, ``st.error`` …), shown as the characters it is: a code span, fenced by one
    backtick more than the longest run inside it (CommonMark). Nothing in a code span is markup: no link (not
    even a bare URL, which GFM would otherwise turn into one after any escaping), no image fetched from another
    host, no HTML, none of Streamlit's ``:red[…]`` / ``:material/…:`` / ``$…$`` extensions. Line breaks become
    spaces."""
    flat = " ".join(str(text).splitlines())
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {flat} {fence}"


# Every ASCII punctuation character may be backslash-escaped in CommonMark; Streamlit's extensions (``:red[…]``,
# ``:material/…:``, ``$…$``) hang off punctuation too.
_MARKDOWN_SPECIAL = re.compile(r"([!-/:-@\[-`{-~])")


def md_text(text: object) -> str:
    """A whole message that holds user text (an error naming a typed path, a verdict naming a device) for a
    markdown surface, in normal type: every punctuation character escaped, so no image is fetched, no link
    hides behind words and no markup applies; a word GFM would turn into a link by itself (``http://…``,
    ``www.…``, an e-mail address) becomes a code span. Use :func:`md` for a value on its own."""
    words = re.split(r"(\s+)", " ".join(str(text).splitlines()))
    return "".join(md(w) if _AUTOLINK.search(w) else _MARKDOWN_SPECIAL.sub(r"\\\1", w) for w in words)


# What GFM's autolink-literal extension links without any markup (it runs on text after escapes are resolved).
_AUTOLINK = re.compile(r"://|www\.|@|mailto:|xmpp:", re.IGNORECASE)


def plot_text(text: object) -> str:
    """``text`` (a device or build label from a log, a package's name) for a plotly string (a trace name, a
    tick label, a marker's text, a hover label), shown as the characters it is: plotly renders a subset of HTML in
    every string (``<a href>`` a clickable link, ``<b>``, ``<span style>``, ``<br>``) and decodes entities, so
    ``&``, ``<`` and ``>`` become entities; in a hover template ``%{`` would be a substitution, so ``%`` is one
    too."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace("%", "&#37;")
