"""Gate 1, bytes → text, and the one normalisation every label goes through.

Before anything is parsed: the size limit, then strict UTF-8 (a UTF-8 BOM is stripped; UTF-16/32, Latin-1,
NUL bytes and other C0 control characters are refused with the line they occur on). Terminal colour codes
(``ESC[…m``, printed by runners such as ANEMLL's chat.py) are removed with a warning before the control check,
so a coloured runner log is still read.
"""

from __future__ import annotations

import re
import unicodedata

from analyzer.measure.logs.records import DEFAULT_LIMITS, LogLimits
from analyzer.measure.logs.rows import Collector, RejectError

_UTF8_BOM = b"\xef\xbb\xbf"
_OTHER_BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\x00\x00\xfe\xff", "UTF-32 (big-endian)"),
    (b"\xff\xfe\x00\x00", "UTF-32 (little-endian)"),
    (b"\xfe\xff", "UTF-16 (big-endian)"),
    (b"\xff\xfe", "UTF-16 (little-endian)"),
)
CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# ECMA-48 CSI sequences (colour, cursor): ESC [ parameters intermediates final-byte.
_ANSI_CSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


def check_size(n_bytes: int, limits: LogLimits = DEFAULT_LIMITS) -> str | None:
    """The size-limit message for a file of ``n_bytes`` (None if within limits); callers holding a
    path (the CLI) use it to refuse a huge file before reading it."""
    if n_bytes > limits.max_file_bytes:
        return (f"file is {n_bytes:,} bytes, over the limit of {limits.max_file_bytes:,} bytes "
                f"({limits.max_file_bytes / 2**20:g} MiB)")
    return None


def line_of_offset(data: bytes | str, offset: int) -> int:
    """1-based line number of a byte/character offset."""
    newline: bytes | str = b"\n" if isinstance(data, bytes) else "\n"
    return data.count(newline, 0, offset) + 1  # type: ignore[arg-type]


class LineCounter:
    """1-based line numbers of offsets into one text, each count starting where the previous one stopped: a count
    from the start per offset is quadratic in a file of many records. An offset before the last one is counted from
    the start."""

    def __init__(self, data: bytes | str):
        self._data, self._offset, self._line = data, 0, 1
        self._newline: bytes | str = b"\n" if isinstance(data, bytes) else "\n"

    def __call__(self, offset: int) -> int:
        if offset < self._offset:
            return line_of_offset(self._data, offset)
        self._line += self._data.count(self._newline, self._offset, offset)  # type: ignore[arg-type]
        self._offset = offset
        return self._line


def decode(data: bytes, limits: LogLimits, col: Collector) -> str:
    """Bytes → text, or ``RejectError`` saying why the file is not UTF-8 text."""
    if len(data) == 0:
        raise RejectError("file is empty (0 bytes)")
    too_big = check_size(len(data), limits)
    if too_big:
        raise RejectError(too_big)
    for bom, encoding in _OTHER_BOMS:
        if data.startswith(bom):
            raise RejectError(f"file is {encoding} (byte-order mark {bom.hex(' ').upper()}); save it as UTF-8")
    data = data.removeprefix(_UTF8_BOM)
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        bad = data[e.start:e.start + 1].hex().upper()
        raise RejectError(f"not valid UTF-8 at byte offset {e.start} (byte 0x{bad}); the file may be "
                          "Latin-1/Windows-1252 or binary: save it as UTF-8",
                          line=line_of_offset(data, e.start)) from e
    # NUL is valid UTF-8 but never text; ASCII saved as UTF-16 without a BOM is every other byte NUL.
    nul = data.find(b"\x00")
    if nul >= 0:
        head = data[:200]
        if head.count(b"\x00") * 3 >= len(head):
            raise RejectError("file contains NUL bytes between characters: it looks like UTF-16 without "
                              "a byte-order mark; save it as UTF-8", line=line_of_offset(data, nul))
        raise RejectError(f"NUL byte at byte offset {nul}: binary data is not a log",
                          line=line_of_offset(data, nul))
    colours = _ANSI_CSI.search(text)
    if colours:
        count = len(_ANSI_CSI.findall(text))
        col.add(line_of_offset(text, colours.start()), None, None, "warning",
                f"{count:,} terminal colour code(s) (ESC[…) removed before reading")
        text = _ANSI_CSI.sub("", text)
    control = CONTROL.search(text)
    if control:
        raise RejectError(f"control character U+{ord(control.group()):04X} at character offset "
                          f"{control.start()}: the file looks binary or corrupted",
                          line=line_of_offset(text, control.start()))
    if not text.strip():
        raise RejectError("file contains only whitespace")
    return text


def normalize_label(text: str) -> str:
    """NFKC, then every format character (Unicode category Cf: zero-width space U+200B, joiners, bidi
    controls U+202A-U+202E and U+2066-U+2069, BOM U+FEFF …) removed, then surrounding whitespace stripped.

    So ``b1`` and ``b1\\u200b`` (or a fullwidth ``ｂ１``) are one build, and no label can reorder how the text
    around it is displayed.
    """
    folded = unicodedata.normalize("NFKC", text)
    return "".join(c for c in folded if unicodedata.category(c) != "Cf").strip()


def invisible_characters(text: str) -> list[str]:
    """The format characters ``normalize_label`` removes from ``text``, as ``U+200B ZERO WIDTH SPACE``."""
    found = dict.fromkeys(c for c in unicodedata.normalize("NFKC", text) if unicodedata.category(c) == "Cf")
    return [f"U+{ord(c):04X} {unicodedata.name(c, 'FORMAT CHARACTER')}" for c in found]


def file_label(name: str) -> str:
    """The display label of an upload: its name, normalised, control characters removed (never a path)."""
    flat = name.replace("\n", " ").replace("\r", " ").replace("\t", " ")
    cleaned = normalize_label(CONTROL.sub("", flat))
    return cleaned[:255] or "<unnamed>"
