"""The rewrite half of ``qfold::fold_gqa_replication`` (analyzer.fold.coreml.gqa_fold): one "folded region" per
attention, grown from each folded matmul (or fused SDPA) through ops that act row by row, and swapped in.

Shapes as in gqa_fold's docstring: ``fold`` writes a query-side tensor ``[B, Hq, M, X]`` as ``[B, Hkv, G·M, X]``,
``unfold`` is the inverse; M (query rows) and X (e.g. the visible cache length of the scores) may be symbolic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from coremltools.converters.mil.mil import Block, Operation, Var
from coremltools.converters.mil.mil import Builder as mb
from coremltools.converters.mil.mil.types.symbolic import is_symbolic

from analyzer.fold.coreml.gqa_pattern import (
    LAST_AXIS_OPS,
    ROW_LOCAL_OPS,
    FoldLayout,
    Replica,
    ReplicaUse,
    plain_shape,
    shape_of,
)


# ------------------------------------------------------------------------------------------------ rewrite
def _is_one(d) -> bool:
    return not is_symbolic(d) and int(d) == 1


def _normalize_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _broadcasts_over_rows(var: Var, rank: int) -> bool:
    """A non-region operand stays valid in the folded layout iff it is 1 along both regrouped axes."""
    shape = var.shape
    if shape is None:
        return False
    aligned = (1,) * (rank - len(shape)) + tuple(shape)
    return len(aligned) == rank and aligned[rank - 3] == 1 and aligned[rank - 2] == 1


def block_inputs(block: Block) -> list[Var]:
    """A block's inputs as a list (a function's block keeps them in a dict)."""
    inputs = block.inputs
    return list(inputs.values()) if isinstance(inputs, dict) else list(inputs)


@dataclass
class _Region:
    """Vars of one function rewritten in the folded layout: original var → (folded var, layout)."""

    folded: dict[Var, tuple[Var, FoldLayout]] = field(default_factory=dict)
    admitted: set[Operation] = field(default_factory=set)


class RegionFolder:
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
    def _reshape_rows(self, var: Var, lead: list[int], rows, last, last_of: Var, before: Operation, what: str) -> Var:
        """``var`` → ``[*lead, rows, last]``. A symbolic ``rows`` becomes -1; a symbolic ``last`` is read at run
        time from ``last_of``'s last axis (``shape`` → ``slice`` → ``concat``: coremltools' type inference of a
        ``0`` dimension over a symbolic one declares a literal 0)."""
        rows = rows if not is_symbolic(rows) else -1
        name = self._name(var.name, what)
        if not is_symbolic(last):
            return mb.reshape(x=var, shape=[*lead, int(rows), int(last)], before_op=before, name=name)
        rank = last_of.rank
        dim = mb.slice_by_index(x=mb.shape(x=last_of, before_op=before, name=self._name(name, "shape")),
                                begin=[rank - 1], end=[rank], before_op=before, name=self._name(name, "last"))
        shape = mb.concat(values=[np.array([*lead, int(rows)], dtype=np.int32), dim], axis=0, before_op=before,
                          name=self._name(name, "dims"))
        return mb.reshape(x=var, shape=shape, before_op=before, name=name)

    def _swap_grid(self, var: Var, a: int, b: int, before: Operation) -> Var:
        """``[*P, H, M, X]`` seen as ``[*P, a, b, ·]`` (a·b = H) → ``[*P, b, a, ·]``: the heads of a ``[G, Hkv]``
        grid regrouped as ``[Hkv, G]`` or back, each head's rows kept whole."""
        p = [int(d) for d in var.shape[:-3]]
        var = mb.reshape(x=var, shape=[*p, a, b, -1], before_op=before, name=self._name(var.name, "grid"))
        perm = [*range(len(p)), len(p) + 1, len(p), len(p) + 2]
        return mb.transpose(x=var, perm=perm, before_op=before, name=self._name(var.name, "swap"))

    def fold(self, var: Var, lay: FoldLayout, before: Operation) -> Var:
        """``[*P, Hq, M, X] → [*P, Hkv, G·M, X]``: a reshape, after the cheapest exact reorder of Q's heads
        when the mapping is not h // G (a transpose for h % Hkv, else a gather). M and X may be symbolic."""
        orig = var
        *p, m, x = var.shape
        p = [int(d) for d in list(p)[:-1]]
        if lay.kind == "h % Hkv":
            var = self._swap_grid(var, lay.g, lay.hkv, before)
        elif lay.kind == "permutation":
            var = mb.gather(x=var, indices=np.asarray(lay.order, dtype=np.int32), axis=len(p), before_op=before,
                            name=self._name(var.name, "perm"))
        return self._reshape_rows(var, [*p, lay.hkv], lay.g * m, x, orig, before, "fold")

    def unfold(self, var: Var, lay: FoldLayout, before: Operation) -> Var:
        """``[*P, Hkv, G·M, X] → [*P, Hq, M, X]``, the inverse of :meth:`fold`."""
        orig = var
        *p, gm, x = var.shape
        p = [int(d) for d in list(p)[:-1]]
        m = gm // lay.g if not is_symbolic(gm) else -1
        if lay.kind == "h % Hkv":
            var = self._swap_grid(var, lay.hkv, lay.g, before)
        var = self._reshape_rows(var, [*p, lay.hq], m, x, orig, before, "unfold")
        if lay.kind == "permutation":
            inverse = np.argsort(np.asarray(lay.order)).astype(np.int32)
            var = mb.gather(x=var, indices=inverse, axis=len(p), before_op=before,
                            name=self._name(var.name, "unperm"))
        return var

    def source_view(self, replica: Replica, before: Operation) -> Var:
        key = id(replica)
        if key not in self.sources:
            var = replica.source
            if tuple(var.shape) != tuple(replica.source_shape):
                shape = [-1 if is_symbolic(d) else int(d) for d in replica.source_shape]
                var = mb.reshape(x=var, shape=shape, before_op=before, name=self._name(var.name, "heads"))
            for cast in replica.casts:
                var = mb.cast(x=var, dtype=cast.dtype.val, before_op=before, name=self._name(var.name, "cast"))
            self.sources[key] = var
        return self.sources[key]

    def fold_mask(self, mask: Var, lay: FoldLayout, before: Operation) -> Var:
        """An SDPA mask ``[.., 1 | Hq, 1 | M, S]`` aligned to the folded rows ``[*P, Hkv, G·M, S]``: as it is when it
        broadcasts over them, its rows tiled G times when it is per row (row g·M + m is row m), folded like Q
        when it is per head."""
        rank = len(lay.prefix) + 3
        if mask.rank < rank:
            mask = mb.expand_dims(x=mask, axes=list(range(rank - mask.rank)), before_op=before,
                                  name=self._name(mask.name, "rank"))
        heads, rows = mask.shape[rank - 3], mask.shape[rank - 2]
        if _is_one(heads) and _is_one(rows):
            return mask
        if _is_one(heads):
            return mb.tile(x=mask, reps=[1] * (rank - 2) + [lay.g, 1], before_op=before,
                           name=self._name(mask.name, "rows"))
        return self.fold(mask, lay, before)

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
            if op.transpose_x.val and a in self.region.folded:
                return f"matmul {op.name!r} transposes its folded left side"
        else:  # mul: the self term, weight column [.., M, 1] times a replicated row [.., 1, D]
            a = op.inputs["y" if param == "x" else "x"]
            if a not in self.region.folded:
                return f"mul {op.name!r} is not part of an attention (its other operand is no attention weight)"
            if a.shape is None or a.shape[-1] != 1 or r.shape[-2] != 1:
                return f"mul {op.name!r} is not a weight column times a replicated row"
        a_shape, r_shape = shape_of(a), tuple(r.shape)
        if a_shape is None:
            return f"{op.op_type} {op.name!r}: query side {a.name!r} has no shape"
        if op.op_type == "matmul" and op.transpose_x.val:  # q read as qᵀ: folded after one transpose of q
            a_shape = (*a_shape[:-2], a_shape[-1], a_shape[-2])
        if use.swapped and op.op_type != "matmul":
            return f"{op.op_type} {op.name!r} reads the replica transposed"
        lay = self._layout(op, a_shape, r_shape, replica, use)
        if isinstance(lay, str):
            return lay
        if a in self.region.folded and self.region.folded[a][1] != lay:
            return f"{op.op_type} {op.name!r}: its query side is folded with another head mapping"
        if any(op_out in self.block.outputs for op_out in op.outputs):
            return f"{op.op_type} {op.name!r} is a program output"
        return replica, use, a, lay

    def _layout(self, op: Operation, a_shape: tuple, r_shape: tuple, replica: Replica, use: ReplicaUse
                ) -> FoldLayout | str:
        """The fold layout of a query side ``[*P, Hq, M, X]`` against a replica ``[*P, Hq, ·, ·]``."""
        if len(a_shape) != len(r_shape) or a_shape[:-3] != r_shape[:-3] or a_shape[-3] != r_shape[-3]:
            return (f"{op.op_type} {op.name!r}: query side {list(plain_shape(a_shape))} does not line up with the "
                    f"replica {list(plain_shape(r_shape))} head for head")
        if any(is_symbolic(d) for d in a_shape[:-2]):
            return f"{op.op_type} {op.name!r}: its batch or head axes are symbolic (the fold needs them static)"
        source = tuple(replica.source.shape)
        if source != tuple(replica.source_shape) and sum(map(is_symbolic, replica.source_shape)) > 1:
            return (f"{op.op_type} {op.name!r}: viewing K/V {replica.source.name!r} as heads needs a static size "
                    "(more than one of its dimensions is symbolic)")
        order = tuple(int(x) for x in np.argsort(np.asarray(use.kv_map), kind="stable"))
        return FoldLayout(tuple(int(d) for d in r_shape[:-3]), int(r_shape[-3]), int(replica.source_shape[-3]),
                          a_shape[-2], order)

    def sdpa_anchor(self, op: Operation) -> tuple | str | None:
        """A fused ``scaled_dot_product_attention`` whose key and value are replicas: the two replicas, the query,
        the mask and the layout; a reason when it cannot be folded; None when it reads no replica."""
        hits = {p: self.replicas[(id(op), p)] for p in ("key", "value") if (id(op), p) in self.replicas}
        if not hits:
            return None
        where = f"scaled_dot_product_attention {op.name!r}"
        if len(hits) != 2:
            return f"{where} reads a replica only as its {next(iter(hits))}"
        (rk, uk), (rv, uv) = hits["key"], hits["value"]
        if uk.kv_map != uv.kv_map:
            return f"{where}: its key and value are replicated with different head mappings"
        q = op.query
        if q in self.region.folded or q.shape is None or len(q.shape) > 4:
            return f"{where}: its query is not a rank ≤ 4 query of its own"
        lay = self._layout(op, tuple(q.shape), tuple(uk.var.shape), rk, uk)
        if isinstance(lay, str):
            return lay
        mask = op.inputs.get("attn_mask")
        if mask is not None:
            rank = len(lay.prefix) + 3
            aligned = (1,) * (rank - (mask.rank or 0)) + tuple(mask.shape or ())
            heads, rows = aligned[rank - 3], aligned[rank - 2]
            # a symbolic row count against symbolic query rows: the mask's rows are the query's (a flexible
            # ``causalMask [1, 1, q, end]``); a mask broadcast over flexible rows would say 1
            per_row = rows == lay.m or (is_symbolic(rows) and is_symbolic(lay.m))
            if len(aligned) != rank or not (_is_one(heads) or heads == lay.hq) or not (
                    _is_one(rows) or per_row) or (heads == lay.hq and aligned[:-3] != lay.prefix):
                return f"{where}: its mask {list(plain_shape(aligned))} does not align with the query rows"
        if op.outputs[0] in self.block.outputs:
            return f"{where} is a program output"
        return rk, rv, q, mask, lay

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
        out = shape_of(op.outputs[0])
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
            if op.op_type == "scaled_dot_product_attention":
                self._fold_sdpa(op)
                continue
            found = self.anchor(op)
            if isinstance(found, str):
                for (cid, _), (replica, _) in self.replicas.items():
                    if cid == id(op):
                        self.refused.setdefault(id(replica.tile), found)
                continue
            if found is not None:
                replica, use, a, lay = found
                transposed = op.op_type == "matmul" and bool(op.transpose_x.val)
                a_folded = reg.folded[a][0] if a in reg.folded else self.fold_once(a, lay, op, transposed)
                src = self.source_view(replica, op)
                if op.op_type == "matmul":  # a replica read as Kᵀ is the source read with transpose_y flipped
                    new = mb.matmul(x=a_folded, y=src, transpose_x=False,
                                    transpose_y=bool(op.transpose_y.val) != use.swapped,
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

    def fold_once(self, var: Var, lay: FoldLayout, before: Operation, transposed: bool = False) -> Var:
        """A query-side input read by several folded matmuls (Q·Kᵀ and the self term) is folded once; one read
        through ``transpose_x`` is transposed first (``[*P, Hq, X, M]`` → ``[*P, Hq, M, X]``)."""
        key = (var, lay, transposed)
        if key not in self.entries:
            src = var
            if transposed:
                rank = var.rank
                src = mb.transpose(x=var, perm=[*range(rank - 2), rank - 1, rank - 2], before_op=before,
                                   name=self._name(var.name, "qt"))
            self.entries[key] = self.fold(src, lay, before)
        return self.entries[key]

    def _fold_sdpa(self, op: Operation) -> None:
        """``sdpa(q, K_rep, V_rep, mask)`` → ``sdpa(q_f, K, V, mask_f)`` on ``[*P, Hkv, G·M, ·]`` rows."""
        found = self.sdpa_anchor(op)
        if found is None:
            return
        if isinstance(found, str):
            for (cid, _), (replica, _) in self.replicas.items():
                if cid == id(op):
                    self.refused.setdefault(id(replica.tile), found)
            return
        rk, rv, q, mask, lay = found
        kwargs = {"query": self.fold_once(q, lay, op), "key": self.source_view(rk, op),
                  "value": self.source_view(rv, op)}
        if mask is not None:
            kwargs["attn_mask"] = self.fold_mask(mask, lay, op)
        new = mb.scaled_dot_product_attention(**kwargs, before_op=op, name=self._name(op.name, "sdpa"))
        self.region.folded[op.outputs[0]] = (new, lay)
        self.region.admitted.add(op)

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
            end_mask = op.inputs.get("end_mask")
            emask = np.array(end_mask.val if end_mask is not None and end_mask.val is not None else [False] * rank)
            begin[rank - 3:rank - 1], end[rank - 3:rank - 1], emask[rank - 3:rank - 1] = 0, 1, True  # whole axes
            kwargs["begin"], kwargs["end"] = begin.astype(np.int32), end.astype(np.int32)
            kwargs["end_mask"] = emask.astype(bool)
        return getattr(mb, op.op_type)(**kwargs, before_op=op, name=self._name(op.name, op.op_type))

    def _exit(self) -> None:
        """Every region var read outside the region is unfolded right after its folded twin."""
        reg = self.region
        for var, (new, lay) in list(reg.folded.items()):
            if any(c not in reg.admitted for c in var.child_ops):
                back = self.unfold(new, lay, var.op)
                self.block.replace_uses_of_var_after_op(anchor_op=var.op, old_var=var, new_var=back)
