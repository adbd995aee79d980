"""Files qfold writes and reads back: atomic JSON writes (other processes read while we write), and JSON
reads that fail with one line naming the file, never a traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from analyzer.errors import QfoldError

# A full-size analysis is ~1 MB; anything far larger is not one of ours.
MAX_JSON_BYTES = 256 << 20


def write_json_atomic(path: Path, obj: Any, compact: bool = False) -> None:
    """Write strict JSON (no NaN or Infinity) beside ``path`` and rename it into place, so readers in other
    processes never see a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(obj, separators=(",", ":") if compact else None, allow_nan=False)
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_json(path: Path, max_bytes: int = MAX_JSON_BYTES, error: type[QfoldError] = QfoldError) -> Any:
    """Parse a UTF-8 JSON file strictly (no NaN/Infinity); every failure is ``error`` naming the file."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise error(f"{path}: {size:,} bytes, more than the {max_bytes:,} a qfold JSON file may have")
        data = path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start})") from e
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from e
    except ValueError as e:  # NaN / Infinity
        raise error(f"{path}: not strict JSON ({e})") from e
    except RecursionError as e:
        raise error(f"{path}: JSON nested too deeply to be a qfold file") from e
