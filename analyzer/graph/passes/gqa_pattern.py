"""The pattern half of ``qfold::fold_gqa_replication`` (analyzer.graph.passes.gqa_fold): what a KV replication
chain looks like, as data, and :func:`maybe_fold`, which checks what the pattern cannot express (shapes, the head
mapping read off the chain on an index tensor) and returns a :class:`Replica` or a :class:`Refusal` with its
reason. Shapes as in gqa_fold's docstring."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from coremltools.converters.mil.mil import Block, Operation, Var
from coremltools.converters.mil.mil.types.symbolic import any_symbolic

# ------------------------------------------------------------------------------------------------ pattern
# Ops that may sit between the stored K/V and the attention operand: each only moves elements, so its
# effect is found by running it on an index tensor. ``tile`` is the copy; ``cast`` commutes with any copy
# (it is re-applied to the un-replicated source).
_View = Callable[[np.ndarray, Operation], np.ndarray]
CHAIN_OPS: dict[str, _View] = {
    "expand_dims": lambda a, op: a.reshape(op.outputs[0].shape),
    "squeeze": lambda a, op: a.reshape(op.outputs[0].shape),
    "reshape": lambda a, op: a.reshape(op.outputs[0].shape),
    "identity": lambda a, op: a,
    "transpose": lambda a, op: a.transpose(op.perm.val),
    "tile": lambda a, op: np.tile(a, op.reps.val),
    "cast": lambda a, op: a,
}
# How far back from a tile a source may lie: views and layout copies, not ``cast`` (values) or ``tile``.
SOURCE_WALK = frozenset({"expand_dims", "squeeze", "reshape", "identity", "transpose"})
# The attention operands a replica may feed: ``matmul``'s y (Q·Kᵀ and P·V), and ``mul`` for the
# read-only-cache self term ``w[..., S:] * v_new`` (weight column [.., M, 1] times a replicated row [.., 1, D]).
ANCHOR_OPS = frozenset({"matmul", "mul"})
# Ops the folded layout flows through unchanged: each output row depends on the same input row only, so
# regrouping rows [Hq, M] → [Hkv, G·M] commutes with them (given the operand checks in ``_admits``).
ELEMENTWISE_OPS = frozenset({
    "add", "sub", "mul", "real_div", "pow", "maximum", "minimum", "select", "clip", "cast",
    "exp", "exp2", "log", "sqrt", "rsqrt", "inverse", "square", "abs", "tanh", "sigmoid", "erf", "silu",
    "gelu", "relu", "softplus", "sign", "floor", "ceil", "round", "sin", "cos", "atan", "scaled_tanh",
    "equal", "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_not", "logical_and",
    "logical_or", "logical_xor",
})
# Ops that act along one axis: in the folded region only along the last one.
LAST_AXIS_OPS = frozenset({"softmax", "concat", "slice_by_index", "reduce_max", "reduce_sum", "reduce_mean",
                           "reduce_log_sum_exp", "reduce_min"})
ROW_LOCAL_OPS = ELEMENTWISE_OPS | LAST_AXIS_OPS


# ------------------------------------------------------------------------------------------------ records
@dataclass(frozen=True, slots=True)
class FoldLayout:
    """How a region's query rows are regrouped: folded row ``j·G·M + g·M + m`` (KV head j) holds query head
    ``order[j·G + g]``, row m. ``order`` is the identity for ``h // G`` (a free reshape), the transpose of a
    ``[G, Hkv]`` grid for ``h % Hkv`` (``x.repeat``), any other permutation a ``gather`` of Q."""

    prefix: tuple[int, ...]
    hq: int
    hkv: int
    m: int
    order: tuple[int, ...]

    @property
    def g(self) -> int:
        return self.hq // self.hkv

    @property
    def kind(self) -> str:
        order = np.asarray(self.order)
        if np.array_equal(order, np.arange(self.hq)):
            return "h // G"
        if np.array_equal(order, np.arange(self.hq).reshape(self.g, self.hkv).T.reshape(-1)):
            return "h % Hkv"
        return "permutation"


@dataclass(frozen=True, slots=True)
class ReplicaUse:
    """One place a replica is read: ``consumer``'s input ``param`` is ``var``, whose head h is a copy of
    the source's KV head ``kv_map[h]``."""

    var: Var
    consumer: Operation
    param: str
    kv_map: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Replica:
    """A tile whose copies are heads of K/V: ``source`` viewed as ``[*prefix, Hkv, S, D]`` (after ``casts``)
    is what every use reads without the copy."""

    tile: Operation
    source: Var
    source_shape: tuple[int, ...]
    casts: tuple[Operation, ...]
    uses: tuple[ReplicaUse, ...]
    chain: tuple[str, ...]  # op types from the source to the attention operand, for the report


@dataclass(frozen=True, slots=True)
class TileDecision:
    """What the pass did with one tile (the CLI's and the report's row)."""

    function: str
    name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    folded: bool
    reason: str = ""  # why not, when not folded
    mapping: str = ""  # "h // G", "h % Hkv", "permutation"
    chain: str = ""  # e.g. "expand_dims → tile → reshape"
    kv_heads: int = 0
    group: int = 0


@dataclass(frozen=True, slots=True)
class Refusal:
    reason: str


# ------------------------------------------------------------------------------------------------ matching
def static_shape(var: Var) -> tuple[int, ...] | None:
    shape = var.shape
    return None if shape is None or any_symbolic(shape) else tuple(int(d) for d in shape)


def head_mapping(r_idx: np.ndarray, source_numel: int) -> tuple[int, tuple[int, ...]] | Refusal:
    """Which KV head each query head of a replica reads, from the replica evaluated on source indices.

    ``r_idx`` is the replica ``[*prefix, Hq, S, D]`` computed on ``arange(source_numel)`` instead of the
    K/V values. It is a head replication iff, seeing the source as ``[*prefix, Hkv, S, D]``, every slice
    ``r[..., h, :, :]`` is exactly source slice ``kv[h]`` with the other axes in place. Returns
    ``(Hkv, kv_map)`` or the reason it is not."""
    if r_idx.ndim < 3:
        return Refusal(f"rank-{r_idx.ndim} output has no head axis")
    *prefix, hq, s, d = r_idx.shape
    if r_idx.size % source_numel or source_numel * hq % r_idx.size:
        return Refusal(f"copies {r_idx.size / source_numel:g}× its source, not a whole number of heads")
    hkv = source_numel * hq // r_idx.size
    if hkv == hq:
        return Refusal("copies nothing along the head axis")
    if hq % hkv:
        return Refusal(f"{hq} heads are not a multiple of {hkv} source heads")
    p, e = int(np.prod(prefix, dtype=np.int64)), s * d
    r = r_idx.reshape(p, hq, e)
    kv = r[0, :, 0] // e
    if kv.min() < 0 or kv.max() >= hkv:
        return Refusal("does not copy whole heads of its source")
    expected = (np.arange(p, dtype=np.int64)[:, None, None] * hkv + kv[None, :, None]) * e + np.arange(e)
    if not np.array_equal(r, expected):
        return Refusal("does not copy along the head axis (heads, slots or head dim are mixed)")
    if not np.all(np.bincount(kv, minlength=hkv) == hq // hkv):
        return Refusal("KV heads are not shared by equal groups of query heads")
    return hkv, tuple(int(x) for x in kv)


def _forward_uses(tile: Operation, block: Block) -> list[tuple[Var, Operation, str, list[Operation]]] | Refusal:
    """Every (var, consumer, param, path) where the tile's output, through chain ops, is read by another op."""
    out: list[tuple[Var, Operation, str, list[Operation]]] = []
    stack: list[tuple[Var, list[Operation]]] = [(tile.outputs[0], [])]
    while stack:
        var, path = stack.pop()
        if var in block.outputs:
            return Refusal(f"its copy {var.name!r} is a program output")
        for child in var.child_ops:
            if child.op_type in CHAIN_OPS and child.op_type != "tile":
                stack.append((child.outputs[0], [*path, child]))
                continue
            for param, v in child.inputs.items():
                if v is var or (isinstance(v, (list, tuple)) and any(x is var for x in v)):
                    out.append((var, child, param, path))
    return out


def _source_candidates(tile: Operation) -> list[tuple[Var, list[Operation]]]:
    """From the tile's input back through views and layout copies that only the chain reads: (var, ops from
    var up to the tile). A copy something else also reads stays anyway, so reading past it gains nothing."""
    out = []
    var, path = tile.x, [tile]
    while True:
        out.append((var, path))
        op = var.op
        if op is None or op.op_type not in SOURCE_WALK or len(op.outputs) != 1 or len(var.child_ops) != 1:
            return out
        data = op.inputs.get("x")
        if data is None:
            return out
        var, path = data, [op, *path]


class IndexCache:
    """Index evaluations keyed by the chain's signature: every layer of a model has the same chain."""

    def __init__(self) -> None:
        self._cache: dict[tuple, np.ndarray] = {}

    def evaluate(self, source_shape: tuple[int, ...], path: list[Operation]) -> np.ndarray:
        key = (source_shape, tuple(_op_signature(op) for op in path))
        hit = self._cache.get(key)
        if hit is None:
            n = int(np.prod(source_shape, dtype=np.int64))
            a = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64).reshape(source_shape)
            for op in path:
                a = CHAIN_OPS[op.op_type](a, op)
            hit = self._cache[key] = a
        return hit


def _op_signature(op: Operation) -> tuple:
    params = tuple(
        (k, tuple(np.asarray(v.val).reshape(-1).tolist()) if v.val is not None else None)
        for k, v in sorted(op.inputs.items()) if k in ("perm", "reps", "axes", "shape")
    )
    return op.op_type, tuple(op.outputs[0].shape), params


def maybe_fold(tile: Operation, block: Block, cache: IndexCache | None = None) -> Replica | Refusal:
    """Resolve a tile to the K/V heads it replicates and the attention operands that read them, or say why
    it is not KV replication feeding attention (conditions the pattern cannot express)."""
    cache = cache or IndexCache()
    for v in (tile.x, tile.outputs[0]):
        if static_shape(v) is None:
            return Refusal(f"{v.name!r} has a symbolic shape")
    if tile.reps.val is None:
        return Refusal("its reps are not constant")
    uses = _forward_uses(tile, block)
    if isinstance(uses, Refusal):
        return uses
    if not uses:
        return Refusal("nothing reads its output")
    for _, consumer, param, _ in uses:
        if consumer.op_type not in ANCHOR_OPS:
            return Refusal(f"feeds {consumer.op_type} {consumer.name!r}, not an attention matmul")
        if consumer.op_type == "matmul" and param != "y":
            return Refusal(f"is the left operand of matmul {consumer.name!r} (only K or V on the right is folded)")
    shapes = {tuple(var.shape) for var, *_ in uses}
    if len(shapes) != 1:
        return Refusal(f"its copies are read in different shapes {sorted(shapes)}")
    r_shape = shapes.pop()
    refusal = Refusal("no source")
    for source, back in _source_candidates(tile)[::-1]:  # deepest first: it removes the most copies
        shape = static_shape(source)
        if shape is None:
            continue
        resolved, refusal = _resolve(source, shape, back, uses, cache)
        if resolved:
            hkv = int(np.prod(shape, dtype=np.int64)) * r_shape[-3] // int(np.prod(r_shape, dtype=np.int64))
            source_shape = (*r_shape[:-3], hkv, *r_shape[-2:])
            chain = tuple(op.op_type for op in back + uses[0][3])
            casts = tuple(op for op in back + uses[0][3] if op.op_type == "cast")
            return Replica(tile, source, source_shape, casts, tuple(resolved), chain)
    return refusal  # the shallowest candidate's reason: the tile's own input, the most direct account


def _resolve(source: Var, shape: tuple[int, ...], back: list[Operation], uses, cache: IndexCache
             ) -> tuple[list[ReplicaUse], Refusal]:
    """Every use of the tile read as a head gather of ``source``, or the first reason one is not."""
    resolved: list[ReplicaUse] = []
    casts: list | None = None
    for var, consumer, param, forward in uses:
        mapping = head_mapping(cache.evaluate(shape, back + forward), int(np.prod(shape, dtype=np.int64)))
        if isinstance(mapping, Refusal):
            return [], mapping
        path_casts = [op.dtype.val for op in back + forward if op.op_type == "cast"]
        if casts is not None and path_casts != casts:
            return [], Refusal("its copies are cast differently on different paths")
        casts = path_casts
        resolved.append(ReplicaUse(var, consumer, param, mapping[1]))
    return resolved, Refusal("")


