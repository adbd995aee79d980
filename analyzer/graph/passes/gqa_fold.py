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

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from coremltools.converters.mil.mil import Block, Operation, Program, Var
from coremltools.converters.mil.mil import Builder as mb
from coremltools.converters.mil.mil.passes.graph_pass import AbstractGraphPass
from coremltools.converters.mil.mil.passes.helper import block_context_manager
from coremltools.converters.mil.mil.passes.pass_registry import register_pass

from analyzer.graph.passes.blocks import block_inputs, remove_dead
from analyzer.graph.passes.gqa_pattern import (
    CHAIN_OPS,
    LAST_AXIS_OPS,
    ROW_LOCAL_OPS,
    SOURCE_WALK,
    FoldLayout,
    IndexCache,
    Refusal,
    Replica,
    ReplicaUse,
    TileDecision,
    maybe_fold,
    static_shape,
)

# Bump when the rewrite changes what it emits: folded packages are cached under (package hash, PASS_VERSION).
PASS_VERSION = 1
PASS_NAME = "qfold::fold_gqa_replication"

# ------------------------------------------------------------------------------------------------ rewrite
def _normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _broadcasts_over_rows(var: Var, rank: int) -> bool:
    """A non-region operand stays valid in the folded layout iff it is 1 along both regrouped axes."""
    shape = var.shape
    if shape is None:
        return False
    aligned = (1,) * (rank - len(shape)) + tuple(shape)
    return len(aligned) == rank and aligned[rank - 3] == 1 and aligned[rank - 2] == 1


@dataclass
class _Region:
    """Vars of one function rewritten in the folded layout: original var → (folded var, layout)."""

    folded: dict[Var, tuple[Var, FoldLayout]] = field(default_factory=dict)
    admitted: set[Operation] = field(default_factory=set)


class _Folder:
    def __init__(self, block: Block, replicas: dict[tuple[int, str], tuple[Replica, ReplicaUse]]):
        self.block = block
        self.replicas = replicas  # (id(consumer), param) → its replica use
        self.region = _Region()
        self.sources: dict[int, Var] = {}  # id(replica) → the source view [*prefix, Hkv, S, D]
        self.refused: dict[int, str] = {}  # id(tile) → why one of its uses was not folded
        self.entries: dict[tuple[Var, FoldLayout], Var] = {}
        self.taken = {v.name for op in block.operations for v in op.outputs} | {v.name for v in block_inputs(block)}

    def _name(self, base: str, what: str) -> str:
        name, n = f"{base}_qfold_{what}", 0
        while name in self.taken:
            n += 1
            name = f"{base}_qfold_{what}_{n}"
        self.taken.add(name)
        return name

    # layout changes ------------------------------------------------------------------------------
    def _swap_grid(self, var: Var, a: int, b: int, before: Operation) -> Var:
        """``[*P, H, M, X]`` seen as ``[*P, a, b, ·]`` (a·b = H·M·X / rest) → ``[*P, b, a, ·]``: the heads of a
        ``[G, Hkv]`` grid regrouped as ``[Hkv, G]`` or back, each head's rows kept whole."""
        p = list(var.shape[:-3])
        rest = int(np.prod(var.shape[-3:])) // (a * b)
        var = mb.reshape(x=var, shape=[*p, a, b, rest], before_op=before, name=self._name(var.name, "grid"))
        perm = [*range(len(p)), len(p) + 1, len(p), len(p) + 2]
        return mb.transpose(x=var, perm=perm, before_op=before, name=self._name(var.name, "swap"))

    def fold(self, var: Var, lay: FoldLayout, before: Operation) -> Var:
        """``[*P, Hq, M, X] → [*P, Hkv, G·M, X]``: a reshape, after the cheapest exact reorder of Q's heads
        when the mapping is not h // G (a transpose for h % Hkv, else a gather)."""
        *p, m, x = var.shape
        p = list(p)[:-1]
        if lay.kind == "h % Hkv":
            var = self._swap_grid(var, lay.g, lay.hkv, before)
        elif lay.kind == "permutation":
            var = mb.gather(x=var, indices=np.asarray(lay.order, dtype=np.int32), axis=len(p), before_op=before,
                            name=self._name(var.name, "perm"))
        return mb.reshape(x=var, shape=[*p, lay.hkv, lay.g * m, x], before_op=before,
                          name=self._name(var.name, "fold"))

    def unfold(self, var: Var, lay: FoldLayout, before: Operation) -> Var:
        """``[*P, Hkv, G·M, X] → [*P, Hq, M, X]``, the inverse of :meth:`fold`."""
        *p, gm, x = var.shape
        p, m = list(p)[:-1], gm // lay.g
        if lay.kind == "h % Hkv":
            var = self._swap_grid(var, lay.hkv, lay.g, before)
        var = mb.reshape(x=var, shape=[*p, lay.hq, m, x], before_op=before, name=self._name(var.name, "unfold"))
        if lay.kind == "permutation":
            inverse = np.argsort(np.asarray(lay.order)).astype(np.int32)
            var = mb.gather(x=var, indices=inverse, axis=len(p), before_op=before,
                            name=self._name(var.name, "unperm"))
        return var

    def source_view(self, replica: Replica, before: Operation) -> Var:
        key = id(replica)
        if key not in self.sources:
            var = replica.source
            if tuple(var.shape) != replica.source_shape:
                var = mb.reshape(x=var, shape=list(replica.source_shape), before_op=before,
                                 name=self._name(var.name, "heads"))
            for cast in replica.casts:
                var = mb.cast(x=var, dtype=cast.dtype.val, before_op=before, name=self._name(var.name, "cast"))
            self.sources[key] = var
        return self.sources[key]

    # admission -----------------------------------------------------------------------------------
    def anchor(self, op: Operation) -> tuple[Replica, ReplicaUse, Var, FoldLayout] | str | None:
        """A matmul/mul reading a replica, with its query-side operand and layout; a reason if it cannot be
        folded; None if it reads no replica."""
        hits = [(p, self.replicas[(id(op), p)]) for p in op.inputs if (id(op), p) in self.replicas]
        if not hits:
            return None
        if len(hits) > 1:
            return f"{op.op_type} {op.name!r} reads two replicas"
        param, (replica, use) = hits[0]
        r = use.var
        if op.op_type == "matmul":
            a = op.x
            if op.transpose_x.val:
                return f"matmul {op.name!r} transposes its query side"
        else:  # mul: the self term, weight column [.., M, 1] times a replicated row [.., 1, D]
            a = op.inputs["y" if param == "x" else "x"]
            if a not in self.region.folded:
                return f"mul {op.name!r} is not part of an attention (its other operand is no attention weight)"
            if a.shape is None or a.shape[-1] != 1 or r.shape[-2] != 1:
                return f"mul {op.name!r} is not a weight column times a replicated row"
        a_shape, r_shape = static_shape(a), tuple(r.shape)
        if a_shape is None:
            return f"{op.op_type} {op.name!r}: query side {a.name!r} has a symbolic shape"
        if len(a_shape) != len(r_shape) or a_shape[:-3] != r_shape[:-3] or a_shape[-3] != r_shape[-3]:
            return (f"{op.op_type} {op.name!r}: query side {list(a_shape)} does not line up with the replica "
                    f"{list(r_shape)} head for head")
        hq = r_shape[-3]
        hkv = replica.source_shape[-3]
        order = tuple(int(x) for x in np.argsort(np.asarray(use.kv_map), kind="stable"))
        lay = FoldLayout(tuple(r_shape[:-3]), hq, hkv, a_shape[-2], order)
        if a in self.region.folded and self.region.folded[a][1] != lay:
            return f"{op.op_type} {op.name!r}: its query side is folded with another head mapping"
        if any(op_out in self.block.outputs for op_out in op.outputs):
            return f"{op.op_type} {op.name!r} is a program output"
        return replica, use, a, lay

    def admits(self, op: Operation) -> FoldLayout | None:
        """Whether a non-anchor op can run in the folded layout of its region inputs."""
        if op.op_type not in ROW_LOCAL_OPS or len(op.outputs) != 1 or op.outputs[0] in self.block.outputs:
            return None
        layouts = set()
        vars_ = [(k, x) for k, v in op.inputs.items() for x in (v if isinstance(v, (list, tuple)) else (v,))]
        for _, v in vars_:
            if v in self.region.folded:
                layouts.add(self.region.folded[v][1])
        if len(layouts) != 1:
            return None
        lay = next(iter(layouts))
        out = static_shape(op.outputs[0])
        rank = len(lay.prefix) + 3
        if out is None or len(out) != rank or out[:-1] != (*lay.prefix, lay.hq, lay.m):
            return None
        for param, v in vars_:
            if v in self.region.folded or (v.val is not None and np.ndim(v.val) == 0):
                continue
            if op.op_type in LAST_AXIS_OPS and param not in ("x", "values"):
                continue  # axis / begin / end / keep_dims: checked below
            if not _broadcasts_over_rows(v, rank):
                return None
        if op.op_type in LAST_AXIS_OPS and not self._last_axis_only(op, rank):
            return None
        return lay

    @staticmethod
    def _last_axis_only(op: Operation, rank: int) -> bool:
        t = op.op_type
        if t in ("softmax", "concat"):
            return op.axis.val is not None and _normalize_axis(int(op.axis.val), rank) == rank - 1
        if t.startswith("reduce_"):
            axes = op.inputs.get("axes")
            keep = op.inputs.get("keep_dims")
            return (axes is not None and axes.val is not None and keep is not None and bool(keep.val)
                    and [_normalize_axis(int(a), rank) for a in axes.val] == [rank - 1])
        if t == "slice_by_index":
            shape, n = op.x.shape, op.x.rank
            begin, end = op.begin.val, op.end.val
            if begin is None or end is None:
                return False

            def flags(param: str, default) -> list:
                v = op.inputs.get(param)
                return list(v.val) if v is not None and v.val is not None else [default] * n

            stride, bmask, emask, smask = (flags("stride", 1), flags("begin_mask", False), flags("end_mask", False),
                                           flags("squeeze_mask", False))
            return all(  # every axis but the last is taken whole
                (bmask[ax] or begin[ax] == 0) and (emask[ax] or end[ax] == shape[ax]) and stride[ax] == 1
                and not smask[ax] for ax in range(n - 1)
            ) and not smask[n - 1]
        return False

    # the walk ------------------------------------------------------------------------------------
    def run(self) -> None:
        reg = self.region
        for op in list(self.block.operations):
            found = self.anchor(op)
            if isinstance(found, str):
                for (cid, _), (replica, _) in self.replicas.items():
                    if cid == id(op):
                        self.refused.setdefault(id(replica.tile), found)
                continue
            if found is not None:
                replica, use, a, lay = found
                a_folded = reg.folded[a][0] if a in reg.folded else self.fold_once(a, lay, op)
                src = self.source_view(replica, op)
                if op.op_type == "matmul":
                    new = mb.matmul(x=a_folded, y=src, transpose_x=False, transpose_y=bool(op.transpose_y.val),
                                    before_op=op, name=self._name(op.name, "matmul"))
                else:
                    pair = {"x": a_folded, "y": src} if use.param == "y" else {"x": src, "y": a_folded}
                    new = mb.mul(**pair, before_op=op, name=self._name(op.name, "mul"))
            else:
                lay = self.admits(op)
                if lay is None:
                    continue
                new = self._rebuild(op, lay)
            reg.folded[op.outputs[0]] = (new, lay)
            reg.admitted.add(op)
        self._exit()

    def fold_once(self, var: Var, lay: FoldLayout, before: Operation) -> Var:
        """A query-side input read by several folded matmuls (Q·Kᵀ and the self term) is folded once."""
        key = (var, lay)
        if key not in self.entries:
            self.entries[key] = self.fold(var, lay, before)
        return self.entries[key]

    def _rebuild(self, op: Operation, lay: FoldLayout) -> Var:
        folded = self.region.folded
        kwargs: dict[str, Any] = {}
        for param, v in op.inputs.items():
            if isinstance(v, (list, tuple)):
                kwargs[param] = type(v)(folded[x][0] if x in folded else x for x in v)
            else:
                kwargs[param] = folded[v][0] if v in folded else v
        if op.op_type == "slice_by_index":  # the regrouped axes are taken whole (checked): re-state them
            rank = len(lay.prefix) + 3
            begin, end = np.array(op.begin.val), np.array(op.end.val)
            begin[rank - 3:rank - 1] = 0
            end[rank - 3:rank - 1] = (lay.hkv, lay.g * lay.m)
            kwargs["begin"], kwargs["end"] = begin.astype(np.int32), end.astype(np.int32)
        return getattr(mb, op.op_type)(**kwargs, before_op=op, name=self._name(op.name, op.op_type))

    def _exit(self) -> None:
        """Every region var read outside the region is unfolded right after its folded twin."""
        reg = self.region
        for var, (new, lay) in list(reg.folded.items()):
            if any(c not in reg.admitted for c in var.child_ops):
                back = self.unfold(new, lay, var.op)
                self.block.replace_uses_of_var_after_op(anchor_op=var.op, old_var=var, new_var=back)


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

    The region grows from each folded matmul through ops that act row by row (elementwise ops whose other
    operands broadcast over heads and rows, softmax/concat/slice/reduce on the last axis), so the scores
    never change layout between Q·Kᵀ and P·V. Weight constants are neither read nor written.
    """

    def __init__(self) -> None:
        self.decisions: list[TileDecision] = []

    def apply(self, prog: Program) -> None:
        self.decisions = []
        for name, f in prog.functions.items():
            self._fold_block(f, name)

    @block_context_manager
    def _fold_block(self, block: Block, function: str) -> None:
        for op in list(block.operations):
            for b in op.blocks:
                self._fold_block(b, function)
        cache = IndexCache()
        tiles = [op for op in block.operations if op.op_type == "tile"]
        replicas: dict[tuple[int, str], tuple[Replica, ReplicaUse]] = {}
        refusals: dict[int, str] = {}
        found: dict[int, Replica] = {}
        for tile in tiles:
            m = maybe_fold(tile, block, cache)
            if isinstance(m, Refusal):
                refusals[id(tile)] = m.reason
                continue
            found[id(tile)] = m
            for use in m.uses:
                replicas[(id(use.consumer), use.param)] = (m, use)
        folder = _Folder(block, replicas)
        if replicas:
            folder.run()
        for tile in tiles:
            rep = found.get(id(tile))
            reason = refusals.get(id(tile)) or folder.refused.get(id(tile), "")
            self.decisions.append(self._decision(function, tile, rep, reason))
        remove_dead(block, [*folder.region.admitted, *self._chain_ops(found.values())])

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
            op = rep.tile.x.op
            while op is not None and op.op_type in SOURCE_WALK and op not in ops:
                ops.append(op)
                op = op.inputs["x"].op
        return ops

    @staticmethod
    def _decision(function: str, tile: Operation, rep: Replica | None, reason: str) -> TileDecision:
        common = dict(function=function, name=tile.outputs[0].name, input_shape=tuple(tile.x.shape),
                      output_shape=tuple(tile.outputs[0].shape))
        if rep is None:
            return TileDecision(**common, folded=False, reason=f"tile {reason}")
        kv_map = np.asarray(rep.uses[0].kv_map)
        hq, hkv = len(kv_map), rep.source_shape[-3]
        lay = FoldLayout((), hq, hkv, 1, tuple(int(x) for x in np.argsort(kv_map, kind="stable")))
        return TileDecision(**common, folded=not reason, reason=reason, mapping=lay.kind,
                            chain=" → ".join(rep.chain), kv_heads=hkv, group=hq // hkv)
