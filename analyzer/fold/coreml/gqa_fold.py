"""``qfold::fold_gqa_replication``: rewrite attention over replicated K/V into the Q-folded form, no copy.

A MIL graph pass in coremltools' style (one class, registered by ``@register_pass``, so
``ct.PassPipeline`` can name it ``"qfold::fold_gqa_replication"``). It reads like rten's fusions: the
pattern is data (:data:`CHAIN_OPS`, :data:`ANCHOR_OPS`, :data:`ROW_LOCAL_OPS`), :func:`maybe_fold` checks
what the pattern cannot express (shapes, the head mapping) and returns a :class:`Replica` or a refusal
reason, and the rewrite grows one "folded region" per attention and swaps it in.

Shapes: B batch, Hq query heads, Hkv KV heads, G = Hq / Hkv, M query rows (1 when decoding), S cache slots,
D head dim. ``fold`` writes a query-side tensor ``[B, Hq, M, X]`` as ``[B, Hkv, G·M, X]``; ``unfold`` is the
inverse. The folded attention keeps every tensor at its original rank (≤ 4 for the graphs converters
emit); the replication chain's rank-5 tensors disappear with it.
"""

from __future__ import annotations

import numpy as np
from coremltools.converters.mil.mil import Block, Operation, Program, Var
from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass
from coremltools.converters.mil.mil.passes.helper import block_context_manager
from coremltools.converters.mil.mil.passes.pass_registry import register_pass

from analyzer.fold.coreml.fold_region import RegionFolder
from analyzer.fold.coreml.gqa_pattern import (
    CHAIN_OPS,
    SOURCE_WALK,
    CopyDecision,
    FoldContext,
    FoldLayout,
    Refusal,
    Replica,
    ReplicaUse,
    RepsFinder,
    Sizes,
    copy_input,
    is_copy,
    maybe_fold,
    plain_shape,
    stated_reps,
)
from analyzer.fold.coreml.reps import RepsProof
from analyzer.ir.replication import IndexCache, Replication


# ------------------------------------------------------------------------------------------------ the pass
@register_pass(namespace="qfold")
class fold_gqa_replication(AbstractGraphPass):  # coremltools names a pass by its class
    """Remove the copies of K/V that grouped-query attention makes to match query heads, by folding the
    query heads into ``[Hkv, G]`` instead. The head mapping is read off the replication chain itself (the
    chain is evaluated on an index tensor), never from names; tiles that are not KV replication feeding
    attention are left alone with a reason in :attr:`decisions`.

    transformers ``repeat_kv`` (expand + reshape; query head h reads KV head h // G)::

        # before                                                      # after
        %e = expand_dims(x=%k, axes=[2])           # [1,Hkv,1,S,D]
        %t = tile(x=%e, reps=[1,1,G,1,1])          # [1,Hkv,G,S,D]
        %kr = reshape(x=%t, shape=[1,Hq,S,D])                         %qf = reshape(x=%q, shape=[1,Hkv,G·M,D])
        %s = matmul(x=%q, y=%kr, transpose_y=True) # [1,Hq,M,S]       %sf = matmul(x=%qf, y=%k, transpose_y=True)
        %w = softmax(x=mul(%s, 0.125), axis=-1)                       %wf = softmax(x=mul(%sf, 0.125), axis=-1)
        %o = matmul(x=%w, y=%vr)                   # [1,Hq,M,D]       %of = matmul(x=%wf, y=%v)   # [1,Hkv,G·M,D]
                                                                      %o = reshape(x=%of, shape=[1,Hq,M,D])

    ``x.repeat(1, G, 1, 1)`` (one tile on the head axis; head h reads KV head **h % Hkv**, so a plain
    reshape of Q would pair the wrong heads; Q's heads are regrouped by a transpose, never K/V)::

        %kr = tile(x=%k, reps=[1,G,1,1])           # [1,Hq,S,D]       %g = reshape(x=%q, shape=[1,G,Hkv,M·D])
        %s = matmul(x=%q, y=%kr, transpose_y=True)                    %p = transpose(x=%g, perm=[0,2,1,3])
                                                                      %qf = reshape(x=%p, shape=[1,Hkv,G·M,D])
                                                                      %sf = matmul(x=%qf, y=%k, transpose_y=True)
                                                                      ... the inverse reshape/transpose/reshape
                                                                      where the region ends

    ``repeat_interleave(G, dim=1)`` (coremltools: transpose → tile → reshape → transpose → reshape →
    transpose; h // G): the deepest un-copied source (the cache itself, before the first transpose) is read
    directly, so the transposes go too. MQA is Hkv = 1 (``[1,1,Hq·M,D]`` against ``[1,1,S,D]``). KV as state
    (``read_state`` / ``slice_update`` / ``coreml_update_state``) and KV as inputs are just sources.
    q_len M > 1 merges the group and query axes (``[1,Hkv,G·M,D]``) so no op exceeds the original rank; a
    mask ``[1,1,M,S]`` then does not broadcast over the folded rows, so the region ends before it
    (``unfold`` — a free reshape for h // G) and restarts at the P·V matmul. The read-only-cache self term
    ``w[..., S:] * v_new`` is folded as ``w_f [1,Hkv,G·M,1] * v_new [1,Hkv,1,D]``.

    K read as Kᵀ (CoreML-LLM: a repeat_interleave chain whose last transpose also swaps S and D, read by a query
    held as ``[1, Hq, D, M]``)::

        # before                                            # after
        %kt = transpose(x=%rep, perm=[1,0,-1,-2])  # [1,Hq,D,S] %qt = transpose(x=%q, perm=[0,1,3,2])
        %s = matmul(x=%q, y=%kt, transpose_x=True)            %qf = reshape(x=%qt, shape=[1,Hkv,G·M,D])
                                                              %sf = matmul(x=%qf, y=%k, transpose_y=True)

    The fused iOS 18 ``scaled_dot_product_attention`` over replicated K and V::

        %o = sdpa(query=%q, key=%kr, value=%vr, attn_mask=%m)   # %m [1,1,M,S]
        # after: sdpa(query=%qf, key=%k, value=%v, attn_mask=tile(x=%m, reps=[1,1,G,1]))  # [1,Hkv,G·M,D]

    (a mask that broadcasts over the rows is passed as it is; one per head is folded like Q). Flexible query
    length and visible context stay symbolic: the reshapes use -1 and, for a symbolic last axis, a shape read at
    run time; a rewrite that needs a static size says which.

    The region grows from each folded matmul through ops that act row by row (elementwise ops whose other
    operands broadcast over heads and rows, softmax/concat/slice/reduce on the last axis), so the scores
    never change layout between Q·Kᵀ and P·V. Weight constants are neither read nor written.
    """

    def __init__(self) -> None:
        self.decisions: list[CopyDecision] = []
        # per function: the shapes at the stated shapes, the flexible ranges, the repeats' probes (package.py sets
        # them for a saved package; a Program built in memory has none, and computed repeats are left, with why)
        self.contexts: dict[str, FoldContext] = {}

    def apply(self, prog: Program) -> None:
        self.decisions = []
        for name, f in prog.functions.items():
            self._fold_block(f, name, RepsFinder(f, self.contexts.get(name, FoldContext())))

    @block_context_manager
    def _fold_block(self, block: Block, function: str, finder: RepsFinder) -> None:
        for op in list(block.operations):
            for b in op.blocks:
                self._fold_block(b, function, finder)
        cache = IndexCache()
        tiles = [op for op in block.operations if is_copy(op)]  # tiles, repeating gathers, concats of one tensor
        replicas: dict[tuple[int, str], tuple[Replica, ReplicaUse]] = {}
        refusals: dict[int, str] = {}
        found: dict[int, Replica] = {}
        verdicts: dict[int, Replication | None] = {}
        proofs: dict[int, RepsProof | None] = {}
        for tile in list(tiles):
            m, verdicts[id(tile)], proofs[id(tile)] = self.match(tile, block, cache, finder)
            if tile.op_type != "tile" and (verdicts[id(tile)] is None or not verdicts[id(tile)].is_kv):
                tiles.remove(tile)  # a gather or concat that copies no K/V heads is an ordinary op (opfacts.listed)
                continue
            if isinstance(m, Refusal):
                refusals[id(tile)] = m.reason
                continue
            found[id(tile)] = m
            for use in m.uses:
                replicas[(id(use.consumer), use.param)] = (m, use)
        folder = RegionFolder(block, replicas)
        if replicas:
            folder.run()
        for tile in tiles:
            rep = found.get(id(tile))
            reason = refusals.get(id(tile)) or folder.refused.get(id(tile), "")
            self.decisions.append(self._decision(function, tile, rep, reason, verdicts[id(tile)], proofs[id(tile)],
                                                 finder.context))
        remove_dead(block, [*folder.region.admitted, *self._chain_ops(found.values())])

    def match(self, tile: Operation, block: Block, cache: IndexCache, finder):
        """What the rewrite does with one copy: the :class:`Replica` it folds (the source and, per use, the head
        mapping the rewrite follows) or the :class:`Refusal`, the classifier's verdict and the proof of its repeats
        over the flexible range (:func:`maybe_fold`). The one place the pass's decision is made, so a test can hand
        the rewrite a wrong mapping and see the proof catch it."""
        return maybe_fold(tile, block, cache, finder)

    @staticmethod
    def _chain_ops(replicas) -> list[Operation]:
        ops: list[Operation] = []
        for rep in replicas:
            for use in rep.uses:
                op = use.var.op
                while op is not None and op not in ops and op.op_type in CHAIN_OPS:
                    ops.append(op)
                    if op is rep.tile:
                        break
                    op = op.inputs["x"].op
            op = copy_input(rep.tile).op
            while op is not None and op.op_type in SOURCE_WALK and op not in ops:
                ops.append(op)
                op = op.inputs["x"].op
        return ops

    @staticmethod
    def _decision(function: str, tile: Operation, rep: Replica | None, reason: str, verdict: Replication | None,
                  proof: RepsProof | None, context: FoldContext) -> CopyDecision:
        if tile.op_type != "tile":
            reps, reps_from = None, None
        elif tile.reps.val is not None:
            reps, reps_from = tuple(int(r) for r in tile.reps.val), "constant"
        else:
            reps, reps_from = (proof.reps if proof is not None else None) or stated_reps(
                tile, Sizes(known=context.known)), "program"
        common = dict(function=function, name=tile.outputs[0].name,
                      input_shape=plain_shape(copy_input(tile).shape), output_shape=plain_shape(tile.outputs[0].shape),
                      replication=verdict is not None and verdict.is_kv, op_type=tile.op_type, reps=reps,
                      reps_from=reps_from, reps_proved=None if proof is None else proof.proved)
        if rep is None:
            extra = {}
            if verdict is not None and verdict.is_kv:
                extra = dict(kv_heads=verdict.kv_heads, group=verdict.group)
            return CopyDecision(**common, folded=False, reason=f"{tile.op_type} {reason}", **extra)
        kv_map = np.asarray(rep.uses[0].kv_map)
        hq, hkv = len(kv_map), rep.source_shape[-3]
        lay = FoldLayout((), hq, hkv, 1, tuple(int(x) for x in np.argsort(kv_map, kind="stable")))
        return CopyDecision(**common, folded=not reason, reason=reason, mapping=lay.kind,
                            chain=" → ".join(rep.chain), kv_heads=hkv, group=hq // hkv)


def remove_dead(block: Block, ops: list[Operation]) -> None:
    """Remove the given ops (and the constants only they read) once nothing reads them, latest first."""
    pending = list(ops)
    changed = True
    while changed:
        changed = False
        for op in list(reversed(pending)):
            if op.enclosing_block is None:
                pending.remove(op)
                continue
            if any(o.child_ops or o in block.outputs for o in op.outputs):
                continue
            producers = [v.op for v in op.inputs.values() if isinstance(v, Var) and v.op is not None]
            producers += [x.op for v in op.inputs.values() if isinstance(v, (list, tuple)) for x in v
                          if x.op is not None]
            block.remove_ops([op])
            pending.remove(op)
            changed = True
            for p in producers:
                if p.op_type == "const" and p not in pending:
                    pending.append(p)
