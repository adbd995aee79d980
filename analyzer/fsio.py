"""Files: JSON other processes read while we write it, and the folders a shared dashboard may read.

A dashboard shared by a team must not let a visitor probe the server's files through its "local folder" and
"existing .mlpackage" fields: such paths are accepted only under the roots in ``$QFOLD_DATA_ROOTS``
(``os.pathsep``-separated; default: the home directory of the user running qfold, which is the machine's
owner when it listens on localhost as it does by default; the Docker image sets ``/data``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from analyzer.errors import QfoldError

DATA_ROOTS_ENV = "QFOLD_DATA_ROOTS"


def write_json_atomic(path: Path, obj: Any, compact: bool = False) -> None:
    """Write JSON beside ``path`` and rename it into place, so readers in other processes never see a
    half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj, separators=(",", ":")) if compact else json.dumps(obj))
    os.replace(tmp, path)


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
