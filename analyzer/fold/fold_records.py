"""The records of a fold report, shared by both backends' folds (no coremltools, no Core AI imports).

Whether a copy replicates KV heads is decided by :func:`analyzer.ir.replication.head_mapping` (the replication
chain evaluated on an index tensor, never names), for the Core ML pass (``gqa_pattern``) and the Core AI rewrite
alike; :class:`TileDecision` is one replication op's row of either report (for Core AI the op is a
``coreai.broadcast_in_dims`` or ``coreai.tile``), :class:`FunctionBytes` and :class:`WeightCheck` the byte and
weight checks beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

# The Core ML pass's (``gqa_fold``) name and version, here so the fold cache's keys are made without coremltools.
# Bump when the rewrite changes what it emits: folded packages are cached under (package hash, PASS_VERSION).
PASS_VERSION = 2
PASS_NAME = "qfold::fold_gqa_replication"


@dataclass(frozen=True, slots=True)
class TileDecision:
    """What the pass did with one tile (the CLI's and the report's row)."""

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


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str


@dataclass(frozen=True, slots=True)
class FunctionBytes:
    """One function's bytes per decode token by category (``analyzer.analysis.accounting``), before and after."""

    function: str
    before: dict[str, int]
    after: dict[str, int]
    kv_replication_tiles_before: int
    kv_replication_tiles_after: int


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
