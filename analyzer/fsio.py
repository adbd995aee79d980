"""Files other processes read while we write them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, obj: Any, compact: bool = False) -> None:
    """Write JSON beside ``path`` and rename it into place, so readers in other processes never see a
    half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, separators=(",", ":")) if compact else json.dumps(obj))
    os.replace(tmp, path)
