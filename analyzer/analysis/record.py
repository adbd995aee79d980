"""The analysis record: one walked program, how it was built, and the figures derived from it.

:class:`Analysis` is what every view reads (diff, report, figures, the catalog, the pages, the CLI). It
stores the program (op records) and, for qfold builds, the :class:`~analyzer.analysis.buildinfo.BuildInfo`;
the summary (op counts, tiles), the byte account and the compression report are derived from the program
when first read, with the current rules, so a stored analysis never shows figures the current code would not
produce.

On disk (``analysis.json`` in a build folder; the shipped analyses; the Export page's download) it is JSON
with a ``schema_version``:
- **3** (this version) stores, beside each op's ``parent`` and the op facts, why a flexible program could not be
  sized at its assumed shapes (the program's ``sizing_error``; ``analyzer.analysis.sizing``).
- **2** is migrated on load: the sizing failure it kept inside the assumed shapes' ``how`` becomes
  ``sizing_error`` (``analyzer.analysis.program_json``), and the op facts are derived again (a copy the
  classifier has no verdict on is now ``unclassified``, not ``other``). The shipped analyses are schema 2 files:
  migrated on every load, never rewritten (full-size conversions regenerate them: ``make shipped``).
- **1** (qfold 0.1.0 before the typed record) is migrated on load as 2 is, and its ops get no parent (the old
  walker flattened nested blocks); each op's layer and tile kind are derived again by the current walker code
  (:func:`analyzer.ir.opfacts.derive_op_facts`). Constant-zero flags are kept: they were read from weight
  data that an analysis does not hold.
- anything else is refused, naming the file and the version.

The derived ``summary``, ``bytes``, ``sizing`` and ``compression_report`` are written too, for readers of the
file, and ignored on load.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from analyzer.analysis.accounting import (
    DEFAULT_WEIGHT_CHARGE,
    ByteAccount,
    BytesPerToken,
    LayerBytes,
    WeightCharge,
    account,
)
from analyzer.analysis.buildinfo import BuildInfo
from analyzer.analysis.compression import CompressionReport, compression_report
from analyzer.analysis.flops import FlopAccount, count_flops
from analyzer.analysis.program_json import program_from_json, program_to_json
from analyzer.analysis.shapes import check_static_shapes, read_sized
from analyzer.analysis.sizing import Sizing, sizing_of
from analyzer.analysis.summary import ProgramSummary
from analyzer.errors import AnalysisFileError
from analyzer.fsio import read_json, write_json_atomic
from analyzer.ir.coreai.asset import looks_like_asset
from analyzer.ir.coreai.walk import ENTRY, read_asset
from analyzer.ir.coreml.mil_reader import list_functions
from analyzer.ir.mil_records import MilProgram
from analyzer.ir.opfacts import derive_op_facts
from analyzer.ir.phase import CallShape, call_shape
from analyzer.jsonfields import Field

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
ANALYSIS_FILE = "analysis.json"
# Keys of the document the analysis itself owns (the rest are the build's, or kept as extra).
_OWN_KEYS = ("schema_version", "compression_report", "summary", "bytes", "sizing", "program")


@dataclass(frozen=True)
class Analysis:
    """One analysed program. ``build`` is None for a package qfold did not build."""

    program: MilProgram
    build: BuildInfo | None = None
    weight_charge: WeightCharge = DEFAULT_WEIGHT_CHARGE  # how compressed weights count (byte_account)
    file: str = ""  # the file it was read from; "" when made in memory or walked from a package
    migrated_from: int | None = None  # the schema version it was stored with, when older than this one

    @cached_property
    def summary(self) -> ProgramSummary:
        return ProgramSummary.of(self.program)

    @cached_property
    def account(self) -> ByteAccount:
        return account(self.program, self.weight_charge)

    @cached_property
    def sizing(self) -> Sizing:
        """Whether every figure could be computed, and if not, why (``analyzer.analysis.sizing``)."""
        return sizing_of(self.program, self.summary, self.account.unsized)

    @cached_property
    def compression(self) -> CompressionReport:
        return compression_report(self.program)

    @cached_property
    def call(self) -> CallShape:
        """What one call does (decode one token / prefill N) and the tokens it consumes."""
        return call_shape(self.program, self.build.spec if self.build else None)

    @cached_property
    def flops(self) -> FlopAccount:
        """FLOPs per call and per token (per prompt token for a prefill), by category and layer."""
        return count_flops(self.program, self.call.tokens_per_call)

    @property
    def bytes_per_token(self) -> BytesPerToken:
        return self.account.per_token()

    @property
    def bytes_by_layer(self) -> tuple[LayerBytes, ...]:
        return self.account.layers()

    @property
    def variant(self) -> str | None:
        return self.build.spec.variant if self.build else None

    @property
    def function(self) -> str:
        return self.program.function

    def with_weight_charge(self, weight_charge: WeightCharge) -> Analysis:
        return self if weight_charge == self.weight_charge else replace(self, weight_charge=weight_charge)

    def to_json(self) -> dict[str, Any]:
        """The ``analysis.json`` document (schema 3)."""
        doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
        if self.build is not None:
            doc.update(self.build.to_json())
            doc["compression_report"] = self.compression.to_json()
        doc["summary"] = self.summary.to_json()
        doc["bytes"] = self.account.to_json()
        doc["sizing"] = self.sizing.to_json()
        doc["program"] = program_to_json(self.program)
        if self.build is not None:
            doc.update({k: v for k, v in self.build.extra.items() if k not in doc})
        return doc


def analysis_from_json(doc: Any, where: str, weight_charge: WeightCharge = DEFAULT_WEIGHT_CHARGE) -> Analysis:
    """A parsed ``analysis.json`` as a record, migrating schemas 1 and 2; ``where`` names the file in errors."""
    f = Field(doc, where)
    f.dict()
    version_field = f.get("schema_version")
    if version_field is None:
        f.fail("no schema_version: not a qfold analysis")
    version = version_field.int()
    if version not in READABLE_VERSIONS:
        newer = " (written by a newer qfold)" if version > SCHEMA_VERSION else ""
        version_field.fail(f"schema version {version}{newer}; this qfold reads versions "
                           f"{', '.join(map(str, READABLE_VERSIONS))}")
    program = program_from_json(f["program"], version)
    if version < SCHEMA_VERSION:
        program = replace(program, ops=tuple(derive_op_facts(program.ops)))
    build = BuildInfo.from_json(f, _OWN_KEYS) if f.get("key") is not None else None
    return Analysis(program, build, weight_charge, where, version if version < SCHEMA_VERSION else None)


def read_analysis_file(path: str | Path, weight_charge: WeightCharge = DEFAULT_WEIGHT_CHARGE) -> Analysis:
    """An ``analysis.json`` (or a build folder holding one)."""
    p = Path(path)
    f = p / ANALYSIS_FILE if p.is_dir() else p
    if not f.is_file():
        raise AnalysisFileError(f"{p}: no {ANALYSIS_FILE} (not a finished qfold build)")
    return analysis_from_json(read_json(f, error=AnalysisFileError), str(f), weight_charge)


def is_analysis_path(path: str | Path) -> bool:
    p = Path(path)
    return (p.is_dir() and (p / ANALYSIS_FILE).is_file()) or (p.is_file() and p.suffix == ".json")


_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_]{1,64}")


def function_analysis_file(function: str) -> str:
    """``analysis.<function>.json``: a build folder's analysis of a function other than its default one (a
    multi-function build; the default function's is ``analysis.json``)."""
    if not _FUNCTION_NAME.fullmatch(function):
        raise AnalysisFileError(f"function name {function!r}: a build stores analyses of functions named with "
                                "letters, digits and _ only")
    return f"analysis.{function}.json"


def function_analysis_files(folder: str | Path) -> tuple[Path, ...]:
    """A build folder's analysis files: ``analysis.json`` (its default function) first, then one per other
    function of a multi-function package, by name."""
    p = Path(folder)
    others = sorted(f for f in p.glob("analysis.*.json") if _FUNCTION_NAME.fullmatch(f.name[9:-5]))
    return (p / ANALYSIS_FILE, *others)


def load_analysis(path: str | Path, function: str | None = None,
                  weight_charge: WeightCharge = DEFAULT_WEIGHT_CHARGE,
                  shapes: Mapping[str, tuple[int, ...]] | None = None) -> Analysis:
    """A build folder, an ``analysis.json``, any ``.mlpackage`` or any Core AI ``.aimodel`` (``function`` picks one
    function of a multi-function package or build; None: its default function). A flexible package is analysed at the
    given ``shapes`` (input name → shape), else at the defaults of :mod:`analyzer.analysis.shapes`."""
    if is_analysis_path(path):
        analysis = read_analysis_file(path, weight_charge)
        if function is None or function == analysis.function:
            return analysis
        p = Path(path)
        other = p / function_analysis_file(function) if p.is_dir() else None
        if other is not None and other.is_file():
            return read_analysis_file(other, weight_charge)
        have = [a.function for a in load_analyses(path, weight_charge)] if p.is_dir() else [analysis.function]
        raise AnalysisFileError(f"{analysis.file}: no function {function!r} (has {', '.join(have)})")
    if looks_like_asset(path):
        return Analysis(_read_asset_function(path, function, shapes), weight_charge=weight_charge)
    return Analysis(read_sized(path, function, shapes), weight_charge=weight_charge)


def _read_asset_function(path: str | Path, function: str | None = None,
                         shapes: Mapping[str, tuple[int, ...]] | None = None) -> MilProgram:
    """An asset's entry graph; its inputs are static, so a given shape must be an input's own (else refused)."""
    if function not in (None, ENTRY):
        raise AnalysisFileError(f"{path}: a Core AI asset is walked from its entry graph {ENTRY!r}, not {function!r}")
    program = read_asset(path)
    check_static_shapes(shapes or {}, program.inputs, path)
    return program


def load_analyses(path: str | Path, weight_charge: WeightCharge = DEFAULT_WEIGHT_CHARGE,
                  shapes: Mapping[str, tuple[int, ...]] | None = None) -> tuple[Analysis, ...]:
    """Every function of a package or a multi-function build (the default one first), or the one analysis of
    an ``analysis.json``."""
    p = Path(path)
    if p.is_dir() and (p / ANALYSIS_FILE).is_file():
        return tuple(read_analysis_file(f, weight_charge) for f in function_analysis_files(p))
    if is_analysis_path(path):
        return (read_analysis_file(path, weight_charge),)
    if looks_like_asset(path):
        return (Analysis(_read_asset_function(path, None, shapes), weight_charge=weight_charge),)
    return tuple(Analysis(read_sized(path, fn, shapes), weight_charge=weight_charge) for fn in list_functions(path))


def write_analysis(path: str | Path, analysis: Analysis) -> None:
    """Write ``analysis.json`` atomically, as strict JSON."""
    write_json_atomic(Path(path), analysis.to_json(), compact=True)
