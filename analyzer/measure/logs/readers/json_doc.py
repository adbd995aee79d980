"""One JSON document read with the line each of its objects starts on, for readers whose records are objects nested
in one document (a benchmark's ``trials``, a community blob's ``runs``): a bad record is reported at its own line.

Python's ``json`` gives no positions, so objects are parsed by the pure-Python scanner with ``parse_object`` wrapped:
each object comes back as a :class:`LinedDict` (a ``dict`` with ``line``). Integers longer than
``analyzer.fsio.MAX_INT_DIGITS`` digits and ``NaN``/``Infinity`` literals are refused, as everywhere qfold reads JSON.
The document may be pasted as it was published: inside one markdown code fence (```json … ```), whose lines keep
their numbers in the file.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
from typing import Any

from analyzer.fsio import IntegerTooLongError, bounded_int
from analyzer.measure.logs.rows import RejectError
from analyzer.measure.logs.text import LineCounter, line_of_offset

_FENCE = re.compile(r"^\s*```[A-Za-z]*[ \t]*\n(?P<body>\s*\{.*\})\s*\n[ \t]*```\s*$", re.DOTALL | re.MULTILINE)


class LinedDict(dict):  # type: ignore[type-arg]
    """A JSON object and the 1-based line of the file its ``{`` is on."""

    line: int = 0


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (a measurement must be finite)")


def document_text(text: str) -> tuple[str, int] | None:
    """The JSON object text and its offset in ``text``: the whole text when it is an object, else the body of the
    one code fence holding an object (as an issue form renders a pasted blob); None when neither."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        return text, 0
    fences = list(_FENCE.finditer(text))
    if len(fences) == 1:
        return fences[0]["body"], fences[0].start("body")
    return None


def loads_with_lines(text: str, offset: int = 0, whole: str | None = None) -> Any:
    """``text`` parsed; every object a :class:`LinedDict` whose line counts in ``whole`` (the file) from
    ``offset``. RejectError naming the line for bad JSON, a too-long integer or a non-finite literal."""
    line_of = LineCounter(whole if whole is not None else text)
    decoder = json.JSONDecoder(parse_int=bounded_int, parse_constant=_no_constant)

    def parse_object(s_and_end: tuple[str, int], *args: Any) -> tuple[LinedDict, int]:
        obj, end = json.decoder.JSONObject(s_and_end, *args)
        lined = LinedDict(obj)
        lined.line = line_of(offset + s_and_end[1] - 1)
        return lined, end

    decoder.parse_object = parse_object  # type: ignore[attr-defined]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # the C scanner would not call parse_object
    try:
        value, end = decoder.raw_decode(text, len(text) - len(text.lstrip()))
    except json.JSONDecodeError as e:
        raise RejectError(f"invalid JSON: {e.msg}", line=line_of(offset + e.pos)) from e
    except IntegerTooLongError as e:
        raise RejectError(f"invalid JSON: {e}") from e
    except ValueError as e:
        raise RejectError(f"invalid JSON: {e}") from e
    except RecursionError as e:
        raise RejectError("JSON nested too deeply to be a benchmark result") from e
    if text[end:].strip():
        raise RejectError("text after the JSON document", line=line_of_offset(whole or text, offset + end))
    return value


def json_text(value: Any) -> str:
    """A JSON value as a cell's text: strings verbatim, the rest as JSON (``true``, ``12.5``, ``[...]``)."""
    return value if isinstance(value, str) else json.dumps(value)


def number_text(value: Any) -> str | None:
    """A JSON number as the text the cell parser reads (``repr`` keeps every digit), or None for anything else
    (a string, a boolean, null: the tools these readers cite write numbers as JSON numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return repr(value)
