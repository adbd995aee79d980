"""The analyses this session sees (shipped, cached builds, its analysed packages), loaded once and shared."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import streamlit as st

from analyzer.analysis.accounting import DEFAULT_WEIGHT_CHARGE, WeightCharge
from analyzer.analysis.record import Analysis, load_analysis
from analyzer.errors import QfoldError
from analyzer.fsio import path_under_roots
from analyzer.report.catalog import (
    AnalysisRef,
    builds_root,
    catalog,
)
from analyzer.report.figures import op_frame
from app_pages.session_keys import Key


def mtime(path: Path) -> float:
    """A file's or folder's mtime, 0.0 when it is gone: the key under which a cached read is kept until it changes."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


Shapes = tuple[tuple[str, tuple[int, ...]], ...]  # a flexible package's given shapes, hashable (AnalysisRef.shapes)


@st.cache_data(show_spinner=False, max_entries=32, ttl=600)
def _catalog(root: str, root_mtime: float, packages: tuple[str, ...],
             shapes: tuple[tuple[str, Shapes], ...]) -> list[AnalysisRef]:
    return catalog(root, packages, shapes={p: dict(s) for p, s in shapes})


def analysis_refs() -> list[AnalysisRef]:
    """Shipped analyses, cached builds (re-read when the builds folder changes) and this session's packages, each
    at the shapes given for it."""
    root = builds_root()
    packages = tuple(st.session_state.get(Key.BUILDS_PACKAGES, ()))
    shapes = tuple((p, package_shapes(p)) for p in packages if package_shapes(p))
    return _catalog(str(root), mtime(root), packages, shapes)


def package_shapes(path: str) -> Shapes:
    """The shapes given for a flexible package on the Builds page (none: the stated defaults)."""
    return tuple(sorted(st.session_state.get(Key.BUILDS_PACKAGE_SHAPES, {}).get(str(path), {}).items()))


def set_package_shapes(path: str, shapes: dict[str, tuple[int, ...]]) -> None:
    given = st.session_state.setdefault(Key.BUILDS_PACKAGE_SHAPES, {})
    if shapes:
        given[str(path)] = dict(shapes)
    else:
        given.pop(str(path), None)


MODEL_SUFFIXES = (".mlpackage", ".aimodel")  # what "Analyse an existing …" and a link's pkg= may name


def model_folder(typed: str) -> Path:
    """A typed path to a Core ML package or Core AI asset on this server, only under $QFOLD_DATA_ROOTS (visitors
    cannot probe the server); anything else is a QfoldError naming it."""
    path = path_under_roots(typed)
    if path.suffix not in MODEL_SUFFIXES or not path.is_dir():
        raise QfoldError(f"{typed.strip()}: not a .mlpackage or .aimodel folder on this server")
    return path


def refs_by_id(refs: Sequence[AnalysisRef]) -> dict[str, AnalysisRef]:
    return {r.id: r for r in refs}


def weight_charge() -> WeightCharge:
    """How compressed weights count per token, as chosen on the A/B page (default: as stored)."""
    return st.session_state.get(Key.WEIGHT_CHARGE, DEFAULT_WEIGHT_CHARGE)


# Frozen records, never mutated: shared across sessions as resources, not copied per call.
@st.cache_resource(show_spinner="Loading the analysis…", max_entries=16)
def _load(path: str, function: str | None, mtime: float, charge: str, shapes: Shapes = ()) -> Analysis:
    # derived figures (summary, bytes) are computed with the current rules, for stored analyses too
    return load_analysis(path, function, charge, dict(shapes) or None)  # type: ignore[arg-type]


def load(ref: AnalysisRef) -> Analysis:
    """The analysis ``ref`` names, at its shapes (raises QfoldError with a message fit for st.error)."""
    args = (str(ref.path), ref.function, mtime(ref.path), weight_charge(), ref.shapes)
    try:
        return _load(*args)
    except QfoldError:
        _load.clear(*args)
        raise


@st.cache_data(show_spinner="Accounting bytes per op…", max_entries=16)
def _op_table(path: str, function: str | None, mtime: float, charge: str, shapes: Shapes = ()) -> pd.DataFrame:
    return op_frame(_load(path, function, mtime, charge, shapes).account.op_rows())


def op_table(ref: AnalysisRef) -> pd.DataFrame:
    """Every op of ``ref`` with the bytes it moves per token, by category."""
    args = (str(ref.path), ref.function, mtime(ref.path), weight_charge(), ref.shapes)
    try:
        return _op_table(*args)
    except QfoldError:
        _op_table.clear(*args)
        raise


def short_label(ref: AnalysisRef) -> str:
    """The variant and kind, for chart legends (the full label is in the picker)."""
    return f"{ref.variant or Path(ref.path).stem} ({ref.kind})"
