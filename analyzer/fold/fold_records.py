"""The records of a fold report, shared by both backends' folds (no coremltools, no Core AI imports).

Whether a copy replicates KV heads is decided by :func:`analyzer.ir.replication.head_mapping` (the replication
chain evaluated on an index tensor, never names), for the Core ML pass (``gqa_pattern``) and the Core AI rewrite
alike. :class:`FoldReport` is what either backend's fold did, and its one JSON document (the ``fold`` CLI's, the
fold cache's and a folded build's): :class:`CopyDecision` is one copy's row (a MIL ``tile``; for Core AI a
``coreai.broadcast_in_dims`` or ``coreai.tile``), :class:`FunctionBytes` and :class:`WeightCheck` the byte and
weight checks beside it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from analyzer.analysis.record import Analysis
from analyzer.ir.mil_records import MilProgram

if TYPE_CHECKING:
    from analyzer.fold.proof import FoldProof

# The Core ML pass's (``gqa_fold``) name and version, here so the fold cache's keys are made without coremltools.
# Bump when the rewrite changes what it emits: folded packages are cached under (package hash, PASS_VERSION).
PASS_VERSION = 4  # 4: tiles[] say whether computed repeats were proved over the range (fold --strict)
PASS_NAME = "qfold::fold_gqa_replication"


@dataclass(frozen=True, slots=True)
class CopyDecision:
    """What a fold did with one copy (the CLI's and the report's row): a MIL ``tile``, or a Core AI
    ``broadcast_in_dims`` / ``tile``."""

    function: str
    name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    folded: bool
    reason: str = ""  # why not, when not folded
    replication: bool = False  # KV replication for attention (analyzer.ir.replication), folded or not
    mapping: str = ""  # "h // G", "h % Hkv", "permutation"
    chain: str = ""  # e.g. "expand_dims → tile → reshape"
    kv_heads: int = 0
    group: int = 0
    op_type: str = "tile"  # the op that copies: tile, gather, concat (Core AI: coreai.broadcast_in_dims, ...)
    reps: tuple[int, ...] | None = None  # a tile's repeats (None for a gather or concat copy, or not evaluated)
    reps_from: str | None = None  # "constant" (its reps input), "program" (computed at run time), None
    # computed repeats: whether their value was proved over the whole flexible range (None: constant or not a tile);
    # a KV copy left for False is what ``fold --strict`` refuses
    reps_proved: bool | None = None


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str


@dataclass(frozen=True, slots=True)
class FunctionBytes:
    """One function's bytes per decode token by category (``analyzer.analysis.accounting``), before and after;
    ``sized`` False when either program could not be sized (``analyzer.analysis.sizing``: the figures then leave
    something out, ``unsized_reason`` says what)."""

    function: str
    before: dict[str, int]
    after: dict[str, int]
    kv_replication_tiles_before: int
    kv_replication_tiles_after: int
    sized: bool = True
    unsized_reason: str | None = None

    @classmethod
    def of(cls, before: MilProgram, after: MilProgram) -> FunctionBytes:
        a, b = Analysis(before), Analysis(after)
        reason = a.sizing.unsized_reason or (None if b.sizing.sized else f"after the fold: {b.sizing.unsized_reason}")
        return cls(before.function, a.account.totals(), b.account.totals(), a.summary.kv_replication_tiles,
                   b.summary.kv_replication_tiles, reason is None, reason)


@dataclass(frozen=True, slots=True)
class WeightCheck:
    """Every stored constant of the original, compared with the folded package's by name."""

    checked: int
    identical: int
    removed: tuple[str, ...]  # constants only the removed replication ops read (none in practice)
    changed: tuple[str, ...]  # names whose dtype, shape or bytes differ (a bug if ever non-empty)

    @property
    def ok(self) -> bool:
        return not self.changed


@dataclass(frozen=True, slots=True)
class FoldReport:
    """What a fold did, either backend: a package's (``analyzer.fold.coreml.package``: the MIL pass) or an asset's
    (``analyzer.fold.coreai.asset_fold``: the MLIR rewrite). ``tiles_*`` count copies of either backend (the names
    are the JSON document's keys)."""

    backend: str  # "coreml" (a .mlpackage) or "coreai" (an .aimodel asset): analyzer.model.backends
    source: str
    output: str
    pass_name: str
    pass_version: int
    decisions: tuple[CopyDecision, ...]
    functions: tuple[FunctionBytes, ...]
    weights: WeightCheck | None  # None when nothing was folded (the output is a byte copy)
    timings_s: dict[str, float] = field(default_factory=dict)
    composite_calls: dict[str, int] = field(default_factory=dict)  # Core AI: each composite body's calls
    proof: FoldProof | None = None  # an asset is proven as it is folded; a package's proof is the cache's

    @property
    def tiles_found(self) -> int:
        return len(self.decisions)

    @property
    def tiles_folded(self) -> int:
        return sum(d.folded for d in self.decisions)

    @property
    def tiles_left(self) -> tuple[CopyDecision, ...]:
        return tuple(d for d in self.decisions if not d.folded)

    @property
    def changed(self) -> bool:
        return self.tiles_folded > 0

    def to_json(self) -> dict[str, Any]:
        """The report's document, the same keys for both backends: copies found / folded / left (each with its
        reason), bytes per token before and after, the per-constant weight check and timings. The proof is a
        document of its own (``FoldProof.to_json``), beside it under ``proof``."""
        return {
            "backend": self.backend, "source": self.source, "pass": self.pass_name, "pass_version": self.pass_version,
            "changed": self.changed, "tiles_found": self.tiles_found, "tiles_folded": self.tiles_folded,
            "tiles_left": len(self.tiles_left), "tiles": [asdict(d) for d in self.decisions],
            "functions": [asdict(f) for f in self.functions],
            "weights": None if self.weights is None else {**asdict(self.weights), "ok": self.weights.ok},
            "composite_calls": self.composite_calls, "timings_s": self.timings_s,
        }


def _copy_ops(report: dict[str, Any]) -> str:
    return "replication ops" if report.get("backend") == "coreai" else "tile ops"


def fold_summary(report: dict[str, Any], proof_headline: str) -> str:
    """One line for the UI from a fold report (:meth:`FoldReport.to_json`) and its proof's headline: copies (MIL
    tiles or Core AI replication ops), bytes per token of the first function, the proof."""
    if not report["changed"]:
        return nothing_folded(report)
    f = report["functions"][0]
    before, after = f["before"]["total"], f["after"]["total"]
    return (f"{report['tiles_folded']} of {report['tiles_found']} {_copy_ops(report)} folded; bytes per token "
            f"{before / (1 << 20):,.1f} → {after / (1 << 20):,.1f} MiB; equivalence: {proof_headline}")


def nothing_folded(report: dict[str, Any]) -> str:
    """What a report that folded nothing says: no copy of K/V for attention, or, when a function could not be
    sized, that whether its copies are KV replication is unknown (never "none" for what was not decided)."""
    ops = _copy_ops(report)
    unsized = [f["function"] for f in report["functions"] if not f.get("sized", True)]
    if unsized:
        return (f"nothing folded: {report['tiles_found']} {ops}; whether they copy K/V for attention is unknown "
                f"(function {', '.join(unsized)} could not be sized)")
    return f"nothing to fold: {report['tiles_found']} {ops}, none copies K/V for attention"
