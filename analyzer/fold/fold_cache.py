"""Where cached folds live: ``<builds>/.folds/<key>/model.mlpackage`` (or ``model.aimodel``) beside its
``fold.json`` record (:mod:`analyzer.fold.cache` makes them). Reading a record needs neither coremltools nor
torch, so the dashboard's headline can say a package is a fold without importing the pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analyzer.convert.launch import ASSET_NAME, PACKAGE_NAME
from analyzer.errors import FoldError, QfoldError
from analyzer.fsio import read_json

FOLDS_DIR = ".folds"
FOLD_FILE = "fold.json"


def fold_record_of(package: str | Path | None) -> dict[str, Any] | None:
    """The ``fold.json`` of a cached fold's package or asset (``<builds>/.folds/<key>/model.mlpackage`` or
    ``model.aimodel``), else None."""
    if package is None:
        return None
    f = Path(package).parent / FOLD_FILE
    if Path(package).name not in (PACKAGE_NAME, ASSET_NAME) or Path(package).parent.parent.name != FOLDS_DIR or \
            not f.is_file():
        return None
    try:
        return read_json(f, error=FoldError)
    except QfoldError:
        return None
