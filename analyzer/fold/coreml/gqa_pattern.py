"""The pattern half of ``qfold::fold_gqa_replication`` (analyzer.fold.coreml.gqa_fold): what a KV replication
chain looks like, as data, and :func:`maybe_fold`, which checks what the pattern cannot express (shapes, the head
mapping read off the chain on an index tensor) and returns a :class:`Replica` or a :class:`Refusal` with its
reason. Whether a tile is KV replication at all is decided by :func:`analyzer.ir.replication.classify_copy`
from the facts :func:`tile_facts` reads here (the walker reads the same facts off a saved package, so the pass and
``inspect`` cannot disagree); the pass adds what its rewrite needs. Shapes as in gqa_fold's docstring."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from coremltools.converters.mil.mil import Block, Function, Operation, Var
from coremltools.converters.mil.mil.types.symbolic import any_symbolic, is_symbolic

from analyzer.fold.coreml.reps import ProbeReps, RepsProof, SymbolicValues, input_symbols, prove_reps
from analyzer.fold.fold_records import CopyDecision, Refusal  # noqa: F401  (CopyDecision re-exported for gqa_fold)
from analyzer.ir.replication import (
    ATTENTION_WEIGHT_OPS,
    MATMUL_LHS,
    MATMUL_RHS,
    MAX_WEIGHT_PATH,
    OTHER,
    PLACEHOLDER_SIZES,
    SDPA_KV,
    SDPA_OTHER,
    WEIGHT_MUL,
    WEIGHT_PATH_OPS,
    CopyFacts,
    CopyRead,
    IndexCache,
    Replication,
    SourceCandidate,
    ViewStep,
    classify_copy,
)

# ------------------------------------------------------------------------------------------------ pattern
# Ops that may sit between the stored K/V and the attention operand: each only moves elements, so its effect is
# found by running it on an index tensor (``analyzer.ir.replication``). ``tile`` is the copy; ``cast`` commutes
# with any copy (it is re-applied to the un-replicated source).
CHAIN_OPS = frozenset({"expand_dims", "squeeze", "reshape", "identity", "transpose", "tile", "cast"})
# How far back from a tile a source may lie: views and layout copies, not ``cast`` (values) or ``tile``.
SOURCE_WALK = frozenset({"expand_dims", "squeeze", "reshape", "identity", "transpose"})
# The attention ops a replica may feed: ``matmul``'s y (Q·Kᵀ, also read as Kᵀ, and P·V), the key and value of
# the fused ``scaled_dot_product_attention``, and ``mul`` for the read-only-cache self term ``w[..., S:] * v_new``
# (weight column [.., M, 1] times a replicated row [.., 1, D]).
ANCHOR_OPS = frozenset({"matmul", "mul", "scaled_dot_product_attention"})
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
    the source's KV head ``kv_map[h]`` (``swapped``: read with its two trailing axes swapped, Kᵀ)."""

    var: Var
    consumer: Operation
    param: str
    kv_map: tuple[int, ...]
    swapped: bool = False


@dataclass(frozen=True, slots=True)
class Replica:
    """A tile whose copies are heads of K/V: ``source`` viewed as ``[*prefix, Hkv, S, D]`` (after ``casts``)
    is what every use reads without the copy."""

    tile: Operation
    source: Var
    source_shape: tuple  # [*prefix, Hkv, S, D]; a dimension may be symbolic
    casts: tuple[Operation, ...]
    uses: tuple[ReplicaUse, ...]
    chain: tuple[str, ...]  # op types from the source to the attention operand, for the report


# ------------------------------------------------------------------------------------------------ matching
def static_shape(var: Var) -> tuple[int, ...] | None:
    shape = var.shape
    return None if shape is None or any_symbolic(shape) else tuple(int(d) for d in shape)


def shape_of(var: Var) -> tuple | None:
    """The var's shape with symbolic dimensions kept (sympy expressions)."""
    return None if var.shape is None else tuple(var.shape)


def plain_shape(shape) -> tuple[int | None, ...]:
    """A shape for reports and JSON: symbolic dimensions as None (never a sympy value)."""
    return tuple(None if is_symbolic(d) else int(d) for d in shape)


class Sizes:
    """Concrete sizes for a chain's shapes. A var whose size at the stated shapes is ``known`` (the package's
    flexible inputs at the shapes its analysis assumes, one interpreter run: ``analyzer.analysis.shapes``) has
    that size. Otherwise one placeholder size ``n`` stands for every symbolic dimension
    (``replication.PLACEHOLDER_SIZES``), so a chain over a flexible sequence or query length is evaluated as one
    concrete chain (the head mapping of a constant-reps tile does not depend on those lengths). A dimension
    coremltools derived from others (``is0*is1/16`` after a ``reshape(-1)``) is evaluated at the same ``n``; one
    that is not a whole number there makes :meth:`dims` return None, and the reader tries the next size."""

    def __init__(self, n: int = PLACEHOLDER_SIZES[0], known: Mapping[str, tuple[int, ...]] | None = None) -> None:
        self.n = n
        self.known = known or {}

    def of(self, var: Var) -> tuple[int, ...] | None:
        """The var's concrete shape: as known at the stated shapes, else :meth:`dims` of its declared shape."""
        known = self.known.get(var.name)
        if known is not None and var.shape is not None and len(known) == len(var.shape):
            return tuple(known)
        return self.dims(var.shape)

    def dims(self, shape) -> tuple[int, ...] | None:
        if shape is None:
            return None
        out = []
        for d in shape:
            if not is_symbolic(d):
                out.append(int(d))
                continue
            value = d.subs(dict.fromkeys(d.free_symbols, self.n))  # d: a sympy expression
            if not value.is_Integer or int(value) < 1:
                return None
            out.append(int(value))
        return tuple(out)


def copy_input(op: Operation) -> Var:
    """What a copy copies: a tile's or gather's ``x``, a concat's (one) value."""
    return op.values[0] if op.op_type == "concat" else op.x


def is_copy(op: Operation) -> bool:
    """A tile; a gather whose constant index repeats an element of a computed tensor (``index_select``); a concat
    of one tensor n times (``torch.cat([k] * G)``; interleaved, ``repeat_interleave``)."""
    if op.op_type == "tile":
        return True
    if op.op_type == "gather":
        idx = op.indices.val
        return (op.x.val is None and idx is not None and np.ndim(idx) == 1 and len(set(np.asarray(idx).tolist())) <
                len(idx) and (op.batch_dims is None or not op.batch_dims.val))
    if op.op_type == "concat":
        return len(op.values) > 1 and all(v is op.values[0] for v in op.values) and op.axis.val is not None
    return False


def _copy_step(op: Operation, out: tuple[int, ...], reps: tuple[int, ...] | None) -> ViewStep | None:
    if op.op_type == "tile":
        reps = tuple(int(r) for r in op.reps.val) if op.reps.val is not None else reps
        return None if reps is None else ViewStep("tile", out, reps=reps)
    rank, n = len(out), len(op.values) if op.op_type == "concat" else 0
    a = int(op.axis.val) % rank
    if op.op_type == "gather":
        size = op.x.shape[a]
        if is_symbolic(size):
            return None
        return ViewStep("gather", out, axis=a, indices=tuple(int(i) % int(size) for i in np.asarray(op.indices.val)))
    if op.interleave is not None and op.interleave.val:
        return ViewStep("gather", out, axis=a, indices=tuple(j // n for j in range(out[a])))
    return ViewStep("tile", out, reps=tuple(n if ax == a else 1 for ax in range(rank)))


def _step(op: Operation, sizes: Sizes, reps: tuple[int, ...] | None = None) -> ViewStep | None:
    """The op as a backend-neutral step at ``sizes``; a tile's repeats are its constant ``reps`` or, computed at run
    time, ``reps`` (their value over the range, or at the stated shapes)."""
    out = sizes.of(op.outputs[0])
    if out is None:
        return None
    if op.op_type in ("tile", "gather", "concat"):
        return _copy_step(op, out, reps)
    if op.op_type == "transpose":
        return None if op.perm.val is None else ViewStep("transpose", out,
                                                           perm=tuple(int(p) % len(out) for p in op.perm.val))
    return ViewStep("identity" if op.op_type in ("cast", "identity") else "reshape", out)


def _read_kind(consumer: Operation, param: str) -> str:
    if consumer.op_type == "matmul":
        return MATMUL_RHS if param == "y" else MATMUL_LHS
    if consumer.op_type == "scaled_dot_product_attention":
        return SDPA_KV if param in ("key", "value") else SDPA_OTHER
    if consumer.op_type == "mul":
        other = consumer.inputs.get("y" if param == "x" else "x")
        for _ in range(MAX_WEIGHT_PATH):
            if other is None or other.op is None:
                break
            if other.op.op_type in ATTENTION_WEIGHT_OPS:
                return WEIGHT_MUL
            if other.op.op_type not in WEIGHT_PATH_OPS:
                break
            other = other.op.inputs.get("x")
    return OTHER


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
    var, path = copy_input(tile), [tile]
    while True:
        out.append((var, path))
        op = var.op
        if op is None or op.op_type not in SOURCE_WALK or len(op.outputs) != 1 or len(var.child_ops) != 1:
            return out
        data = op.inputs.get("x")
        if data is None:
            return out
        var, path = data, [op, *path]


def stated_reps(tile: Operation, sizes: Sizes) -> tuple[int, ...] | None:
    """A tile's repeats at the stated shapes: its output's size over its input's, axis by axis, both as one
    interpreter run sized them (None when either is not known)."""
    if tile.op_type != "tile":
        return None
    x, out = sizes.known.get(tile.x.name), sizes.known.get(tile.outputs[0].name)
    if x is None or out is None or len(x) != len(out) or any(i == 0 or o % i for i, o in zip(x, out, strict=True)):
        return None
    return tuple(o // i for i, o in zip(x, out, strict=True))


def tile_facts(tile: Operation, block: Block, sizes: Sizes, reps: tuple[int, ...] | None = None
               ) -> tuple[CopyFacts, list, list] | Refusal:
    """The backend-neutral facts of a tile in a pymil block (the same facts ``analyzer.ir.opfacts`` reads off
    a walked package), with the uses and source candidates they were read from. ``reps``: the repeats of a tile
    whose ``reps`` are computed at run time (:func:`maybe_fold` finds them)."""
    if tile.op_type == "tile" and tile.reps.val is None and reps is None:
        return Refusal("its reps are computed at run time and were not evaluated at the stated shapes")
    uses = _forward_uses(tile, block)
    if isinstance(uses, Refusal):
        return uses
    candidates = []
    for depth, (var, back) in enumerate(_source_candidates(tile)):
        shape, steps = sizes.of(var), [_step(op, sizes, reps) for op in back]
        if shape is None or any(s is None for s in steps):
            break
        candidates.append(SourceCandidate(shape, tuple(steps), depth))
    reads = []
    for _, consumer, param, path in uses:
        steps = [_step(op, sizes) for op in path]
        if any(s is None for s in steps):
            return Refusal("its chain's symbolic shapes cannot be sized")
        reads.append(CopyRead(consumer.op_type, consumer.name, _read_kind(consumer, param), tuple(steps), param))
    in_shape, out_shape = sizes.of(copy_input(tile)), sizes.of(tile.outputs[0])
    if not candidates or in_shape is None or out_shape is None:
        return Refusal("its shapes cannot be sized")
    return CopyFacts(tile.outputs[0].name, in_shape, out_shape, tuple(candidates), tuple(reads)), uses, \
        _source_candidates(tile)


@dataclass(frozen=True)
class FoldContext:
    """What the pass knows of one function beyond the program: every value's shape at the stated shapes (the
    flexible inputs at the shapes the analysis assumes), the flexible inputs' ranges (name → (lower, upper)), and
    a way to evaluate a tile's repeats at the range's bounds and default (``reps.ProbeReps``). Empty for a
    program of static shapes."""

    known: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    ranges: Mapping[str, tuple[tuple[int, ...], tuple[int | None, ...]]] = field(default_factory=dict)
    probe: ProbeReps | None = None


class RepsFinder:
    """One function's computed repeats: each tile's :class:`~analyzer.fold.coreml.reps.RepsProof`, made once."""

    def __init__(self, function: Function | None, context: FoldContext) -> None:
        self.context, self.values = context, SymbolicValues()
        self.symbols = input_symbols(function) if function is not None else {}
        self._proofs: dict[int, RepsProof] = {}

    def proof(self, tile: Operation) -> RepsProof:
        if id(tile) not in self._proofs:
            self._proofs[id(tile)] = prove_reps(tile, self.symbols, self.context.ranges, self.values,
                                                self.context.probe)
        return self._proofs[id(tile)]


def maybe_fold(tile: Operation, block: Block, cache: IndexCache | None = None, finder: RepsFinder | None = None
               ) -> tuple[Replica | Refusal, Replication | None, RepsProof | None]:
    """Resolve a tile to the K/V heads it replicates and the attention operands that read them, or say why
    it is not (``analyzer.ir.replication.classify_copy``) or why the pass cannot rewrite it. Returns the
    replica or refusal, the classifier's verdict (None when the facts could not be read) and, for repeats computed
    at run time, their proof over the flexible range (None for constant ``reps``).

    Computed repeats: the classifier decides on their value at the stated shapes; the copy is folded only where
    :func:`~analyzer.fold.coreml.reps.prove_reps` shows that value holds over the whole range, else it is left
    with the reason (``repeats depend on NAME[axis] over LO..HI``)."""
    cache = cache or IndexCache()
    finder = finder or RepsFinder(None, FoldContext())
    proof = finder.proof(tile) if tile.op_type == "tile" and tile.reps.val is None else None
    reps = proof.reps if proof is not None and proof.reps is not None else None
    reps = reps or stated_reps(tile, Sizes(known=finder.context.known))
    for n in PLACEHOLDER_SIZES:  # symbolic dimensions: the first size at which every dimension is whole
        found = tile_facts(tile, block, Sizes(n, finder.context.known), reps)
        if not isinstance(found, Refusal) or not found.reason.startswith("its "):
            break
    if isinstance(found, Refusal):
        return found, None, proof
    facts, uses, candidates = found
    verdict = classify_copy(facts, cache)
    if not verdict.is_kv:
        return Refusal(verdict.reason), verdict, proof
    if proof is not None and not proof.proved:
        return Refusal(proof.reason), verdict, proof
    for (_, consumer, _, _), read in zip(uses, facts.reads, strict=True):
        if read.kind == MATMUL_LHS:
            return Refusal(f"is the left operand of matmul {consumer.name!r} (only K or V on the right is "
                           "folded)"), verdict, proof
    shapes = {shape_of(var) for var, *_ in uses}
    if len(shapes) != 1:
        return Refusal(f"its copies are read in different shapes {sorted(map(plain_shape, shapes))}"), verdict, proof
    r_shape = shapes.pop()
    source, back = candidates[verdict.source_depth]
    hkv, swapped = verdict.kv_heads, verdict.reads[0].swapped
    a, b = (r_shape[-1], r_shape[-2]) if swapped else (r_shape[-2], r_shape[-1])
    source_shape = (*r_shape[:-3], hkv, a, b)
    path_casts = {tuple(op.dtype.val for op in back + forward if op.op_type == "cast") for *_, forward in uses}
    if len(path_casts) != 1:
        return Refusal("its copies are cast differently on different paths"), verdict, proof
    casts = tuple(op for op in back + uses[0][3] if op.op_type == "cast")
    chain = tuple(op.op_type for op in back + uses[0][3])
    replica_uses = tuple(ReplicaUse(var, consumer, param, m.kv_map, m.swapped)
                         for (var, consumer, param, _), m in zip(uses, verdict.reads, strict=True))
    return Replica(tile, source, source_shape, casts, replica_uses, chain), verdict, proof
