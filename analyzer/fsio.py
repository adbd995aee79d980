"""Files qfold writes and reads back, and the folders a shared dashboard may read.

* Atomic JSON writes: other processes read while we write.
* Strict JSON reads: NaN/Infinity refused naming the field, nesting and size bounded, every failure one line
  naming the file — never a traceback. Configs, analyses and caches all go through :func:`loads_strict`.
* Data roots: a dashboard shared by a team must not let a visitor probe the server's files through its "local
  folder" and "existing .mlpackage" fields: such paths are accepted only under the roots in
  ``$QFOLD_DATA_ROOTS`` (``os.pathsep``-separated; default: the home directory of the user running qfold, which
  is the machine's owner when it listens on localhost as it does by default; the Docker image sets ``/data``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from analyzer.errors import QfoldError

DATA_ROOTS_ENV = "QFOLD_DATA_ROOTS"
# A full-size analysis is ~1 MB; anything far larger is not one of ours.
MAX_JSON_BYTES = 256 << 20
# qfold's own files nest < 10 levels (an analysis: ops → inputs → tensor → shape); configs a few.
MAX_JSON_DEPTH = 64


def write_json_atomic(path: Path, obj: Any, compact: bool = False) -> None:
    """Write JSON beside ``path`` and rename it into place, so readers in other processes never see a
    half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, separators=(",", ":") if compact else None, allow_nan=False))
    os.replace(tmp, path)


class _NonFinite:
    """Stands in for a NaN/Infinity literal while parsing, so the refusal can name where it was."""

    def __init__(self, literal: str):
        self.literal = literal


def _check_structure(value: Any, where: str, max_depth: int, error: type[QfoldError]) -> None:
    """Refuse NaN/Infinity (naming the field) and nesting deeper than ``max_depth``."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        v, path, depth = stack.pop()
        if depth > max_depth:
            raise error(f"{where}: nested deeper than {max_depth} levels")
        if isinstance(v, _NonFinite):
            field = f"field {path}" if path else "the value"
            raise error(f"{where}: {field} is {v.literal}; only finite numbers are accepted")
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{k}" if path else str(k), depth + 1) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))


def loads_strict(text: str, where: str, max_depth: int = MAX_JSON_DEPTH,
                 error: type[QfoldError] = QfoldError) -> Any:
    """Parse JSON text strictly; ``json.JSONDecodeError`` passes through for callers that fall back to text."""
    try:
        value = json.loads(text, parse_constant=_NonFinite)
    except RecursionError:
        raise error(f"{where}: nested deeper than {max_depth} levels") from None
    _check_structure(value, where, max_depth, error)
    return value


def read_json(path: Path, max_bytes: int = MAX_JSON_BYTES, error: type[QfoldError] = QfoldError,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse a UTF-8 JSON file strictly (no NaN/Infinity, bounded size and depth); every failure is ``error``
    naming the file."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error(f"{path}: {size:,} bytes, more than the {max_bytes:,} this file may have")
        data = path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start})") from e
    try:
        return loads_strict(text, str(path), max_depth, error)
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from e


def data_roots() -> tuple[Path, ...]:
    """The folders user-typed paths may point into (resolved)."""
    text = os.environ.get(DATA_ROOTS_ENV)
    roots = [Path(p).expanduser() for p in text.split(os.pathsep) if p.strip()] if text else [Path.home()]
    return tuple(r.resolve() for r in roots)


def path_under_roots(text: str, roots: tuple[Path, ...] | None = None) -> Path:
    """``text`` as a resolved path (symlinks followed) if it lies under one of the data roots, else a
    QfoldError that says nothing about whether the path exists."""
    roots = data_roots() if roots is None else roots
    if "\0" in text:
        raise QfoldError("a path cannot contain a NUL character")
    path = Path(text.strip()).expanduser().resolve()
    if not any(path == r or r in path.parents for r in roots):
        names = ", ".join(str(r) for r in roots) or "none"
        raise QfoldError(f"{text.strip()}: outside the folders this server may read ({DATA_ROOTS_ENV}: {names})")
    return path
