"""The records of a fold report, shared by both backends' folds (no coremltools, no Core AI imports).

:func:`head_mapping` is the one test of "this copy replicates KV heads": the replication chain evaluated on an
index tensor, never names. The Core ML pass (``gqa_pattern``) and the Core AI fold (``analyzer.ir.coreai``)
both decide with it; :class:`TileDecision` is one replication op's row of either report (for Core AI the op is a
``coreai.broadcast_in_dims`` or ``coreai.tile``), :class:`FunctionBytes` and :class:`WeightCheck` the byte and
weight checks beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from analyzer.ir import replication

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


# ------------------------------------------------------------------------------------------------ matching
def head_mapping(r_idx: np.ndarray, source_numel: int) -> tuple[int, tuple[int, ...]] | Refusal:
    """Which KV head each query head of a replica reads: the one head-replication test
    (:func:`analyzer.ir.replication.head_mapping`, the classifier both backends share) in the fold report's
    terms, ``(Hkv, kv_map)`` or a :class:`Refusal`. A head read transposed is refused here; the Core AI rewrite
    tries the swapped view itself."""
    verdict = replication.head_mapping(r_idx, source_numel)
    if isinstance(verdict, str):
        return Refusal(verdict)
    if verdict.swapped:
        return Refusal("reads each head transposed")
    return verdict.kv_heads, verdict.kv_map


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
