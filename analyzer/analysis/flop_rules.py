"""The FLOP rules: one documented class per kind of op, registered by op type (in the manner of the byte rules),
and the context they read the program through. The conventions are in :mod:`analyzer.analysis.flops`."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from analyzer.analysis.compression import weight_part
from analyzer.ir.coreai.dialect import PER_CALL_DECOMPRESSION
from analyzer.ir.layer_order import projection_ops
from analyzer.ir.mil_records import VIEW_OPS, InputRef, MilProgram, OpRecord

# weight_part's parts → FLOP categories
_PART_CATEGORY = {"attn": "projections", "ffn": "ffn", "lm_head": "lm_head", "embed": "lm_head"}
# Ops a score tensor passes through on its way to the softmax (scale, softcap, mask add, the read-only cache's
# concat with the new token's score), and a probability tensor on its way to P·V.
_TO_SOFTMAX = VIEW_OPS | {"cast", "mul", "add", "sub", "real_div", "tanh", "concat", "select", "slice_by_index",
                          "slice_by_size", "transpose", "maximum", "minimum", "clip"}
_FROM_SOFTMAX = VIEW_OPS | {"cast", "slice_by_index", "slice_by_size", "transpose", "concat", "mul"}
_MAX_HOPS = 8


# ------------------------------------------------------------------------------------------------- context
@dataclass
class FlopContext:
    """The program being counted and the dataflow questions the rules ask of it."""

    program: MilProgram
    consumers: dict[int, list[int]] = field(default_factory=dict)
    unsized: list[str] = field(default_factory=list)
    estimated: list[str] = field(default_factory=list)
    projections: set[int] | None = None  # ops projecting into or out of attention, found when first asked

    def op(self, index: int) -> OpRecord:
        return self.program.ops[index]

    def is_weight(self, ref: InputRef) -> bool:
        if ref.is_const:
            return True
        if ref.producer is not None and self.program.backend == "coreai":  # Core AI transposes weights per call
            return self._weight_source(ref) is not None
        return ref.producer is not None and self.op(ref.producer).type.startswith("constexpr_")

    def _weight_source(self, ref: InputRef, hops: int = 0) -> InputRef | None:
        """A Core AI constant seen through the transposes, reshapes and casts the program applies to it."""
        if ref.is_const or hops > _MAX_HOPS:
            return ref if ref.is_const else None
        producer = self.op(ref.producer) if ref.producer is not None else None
        if producer is not None and producer.type in PER_CALL_DECOMPRESSION:  # a compressed weight: its stored data
            x = next((r for r in producer.inputs if r.param in ("indices", "data")), None)
            return None if x is None else self._weight_source(x, hops + 1)
        if producer is None or producer.kind not in ("transpose", "cast", *VIEW_OPS):
            return None
        x = next((r for r in producer.inputs if r.param == "x"), None)
        return None if x is None else self._weight_source(x, hops + 1)

    def weight_name(self, ref: InputRef) -> str:
        source = self._weight_source(ref) if self.program.backend == "coreai" else None
        return (source or ref).tensor.name

    def is_zero(self, ref: InputRef) -> bool:
        return ref.producer is not None and self.op(ref.producer).const_zero

    def reaches_softmax(self, index: int, hops: int = 0) -> bool:
        """Whether op ``index``'s output flows into a softmax through scale/mask/concat/view ops only."""
        if hops > _MAX_HOPS:
            return False
        for c in self.consumers.get(index, ()):
            t = self.op(c).kind
            if t == "softmax" or (t in _TO_SOFTMAX and self.reaches_softmax(c, hops + 1)):
                return True
        return False

    def from_softmax(self, ref: InputRef, hops: int = 0) -> bool:
        """Whether an input comes out of a softmax through view/slice/cast ops only."""
        if ref.producer is None or hops > _MAX_HOPS:
            return False
        producer = self.op(ref.producer)
        if producer.kind == "softmax":
            return True
        return producer.kind in _FROM_SOFTMAX and any(
            self.from_softmax(r, hops + 1) for r in producer.inputs if not r.is_const)

    def weight_category(self, op: OpRecord, ref: InputRef) -> str:
        """By the weight's name; a name that says nothing (``conv_3_weight``): q/k/v/o projections by where the
        op sits around attention (``layer_order.projection_ops``), a tied embedding's as lm_head, other weights
        of a layer as ffn."""
        where = weight_part(self.weight_name(ref), [op.kind])
        if where is None:
            if self.projections is None:
                self.projections = projection_ops(self.program.ops)
            tied = ref.producer is not None and any(self.op(c).type == "gather" for c in self.consumers[ref.producer])
            if op.index in self.projections:
                return "projections"
            if tied:  # the embedding table read back as the output projection
                return "lm_head"
            return "ffn" if op.layer is not None else "other"
        parts, _ = where
        return _PART_CATEGORY.get(parts[-1], "other")


def _elements(shape) -> int | None:
    if any(d is None for d in shape):
        return None
    return math.prod(shape)  # type: ignore[arg-type]


def _out_elements(op: OpRecord, ctx: FlopContext) -> int:
    n = _elements(op.outputs[0].shape) if op.outputs else 0
    if n is None:
        ctx.unsized.append(op.name)
        return 0
    return n


def _input(op: OpRecord, *params: str) -> InputRef | None:
    return next((r for r in op.inputs if r.param in params), None)


# ------------------------------------------------------------------------------------------------- rules
FLOP_RULES: dict[str, type[FlopRule]] = {}


def register_flop_rule(*op_types: str):
    def deco(cls: type[FlopRule]) -> type[FlopRule]:
        for t in op_types:
            if t in FLOP_RULES:
                raise ValueError(f"FLOP rule for {t!r} registered twice")
            FLOP_RULES[t] = cls
        cls.op_types = op_types
        return cls

    return deco


class FlopRule:
    """Count one op's FLOPs per call: ``count`` returns ``{category: flops}``."""

    name: ClassVar[str]
    op_types: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def count(cls, op: OpRecord, ctx: FlopContext) -> dict[str, int]:
        raise NotImplementedError


@register_flop_rule("matmul")
class MatmulRule(FlopRule):
    """``x [..., M, K] · y [..., K, N] → [..., M, N]`` (either side possibly transposed): 2 · (output
    elements) · K. K is read from the shapes without the transpose flags: the last two dims of ``x`` hold M·K
    elements and M is the output's second-to-last dim, so K = (x's last two dims) ÷ M (a rank-1 ``x`` is K).
    A constant operand makes it a weight's matmul (categorised by the weight's name); two activations are
    attention scores when the output reaches a softmax, attention values when an input comes from one."""

    name = "matmul"

    @classmethod
    def count(cls, op, ctx):
        x, y = _input(op, "x"), _input(op, "y")
        out = _out_elements(op, ctx)
        if x is None or y is None or not out:
            return {}
        xs = x.tensor.shape
        if any(d is None for d in xs) or not xs:
            ctx.unsized.append(op.name)
            return {}
        if len(xs) == 1:
            k = xs[0]
        elif len(y.tensor.shape) == 1:  # matrix · vector
            k = xs[-1]
        else:
            m = op.outputs[0].shape[-2] if len(op.outputs[0].shape) >= 2 else 1
            k = (xs[-2] * xs[-1]) // max(m or 1, 1)
        flops = 2 * out * k
        weight = next((r for r in (x, y) if ctx.is_weight(r)), None)
        if weight is not None:
            return {ctx.weight_category(op, weight): flops}
        if ctx.reaches_softmax(op.index):
            return {"attention_scores": flops}
        if ctx.from_softmax(x) or ctx.from_softmax(y):
            return {"attention_values": flops}
        return {"other": flops}


def _bias_flops(op: OpRecord, ctx: FlopContext, out: int) -> int:
    bias = _input(op, "bias")
    return out if bias is not None and not ctx.is_zero(bias) else 0


@register_flop_rule("linear")
class LinearRule(FlopRule):
    """``x [..., in] · Wᵀ [in, out] + b``: 2 · (output elements) · in, plus the output elements for a bias
    that is not all zeros. Categorised by the weight's name (q/k/v/o → projections, MLP → ffn, lm_head or
    the tied embedding → lm_head)."""

    name = "linear"

    @classmethod
    def count(cls, op, ctx):
        weight = _input(op, "weight")
        out = _out_elements(op, ctx)
        if weight is None or not out or not weight.tensor.shape or weight.tensor.shape[-1] is None:
            return {}
        flops = 2 * out * weight.tensor.shape[-1] + _bias_flops(op, ctx, out)
        return {ctx.weight_category(op, weight): flops}


@register_flop_rule("conv", "conv_transpose")
class ConvRule(FlopRule):
    """``conv``: weight ``[C_out, C_in / groups, *kernel]``, 2 · (output elements) · (C_in / groups · kernel
    elements); ``conv_transpose`` (weight ``[C_in, C_out / groups, *kernel]``): 2 · (input elements) · (C_out /
    groups · kernel elements). A non-zero bias adds the output elements. A 1×1 conv over a sequence is a linear
    (how some Neural Engine converters write projections) and is categorised by its weight's name alike."""

    name = "conv"

    @classmethod
    def count(cls, op, ctx):
        weight, x = _input(op, "weight"), _input(op, "x")
        out = _out_elements(op, ctx)
        per = _elements(weight.tensor.shape[1:]) if weight is not None else None
        if not out or per is None or x is None:
            return {}
        if op.type == "conv":
            flops = 2 * out * per
        else:
            n_in = _elements(x.tensor.shape)
            if n_in is None:
                ctx.unsized.append(op.name)
                return {}
            flops = 2 * n_in * per
        flops += _bias_flops(op, ctx, out)
        category = ctx.weight_category(op, weight) if weight is not None and ctx.is_weight(weight) else "other"
        return {category: flops}


@register_flop_rule("einsum")
class EinsumRule(FlopRule):
    """Two operands: 2 · (output elements) · K. The equation is an attribute the walked record does not keep,
    so K is estimated as the elements of ``x`` not matched (by size, as a multiset) by output dims; the op is
    listed in ``estimated``. Categorised like a matmul."""

    name = "einsum"

    @classmethod
    def count(cls, op, ctx):
        values = [r for r in op.inputs if r.param == "values"] or [r for r in op.inputs if r.param != "equation"]
        out = _out_elements(op, ctx)
        if len(values) < 2 or not out:
            return {}
        x = values[0].tensor.shape
        if any(d is None for d in x):
            ctx.unsized.append(op.name)
            return {}
        free = list(op.outputs[0].shape)
        k = 1
        for d in x:
            if d in free:
                free.remove(d)
            else:
                k *= d
        ctx.estimated.append(op.name)
        flops = 2 * out * k
        weight = next((r for r in values if ctx.is_weight(r)), None)
        if weight is not None:
            return {ctx.weight_category(op, weight): flops}
        if ctx.reaches_softmax(op.index):
            return {"attention_scores": flops}
        if any(ctx.from_softmax(r) for r in values):
            return {"attention_values": flops}
        return {"other": flops}


ELEMENTWISE_OPS = (
    "add", "sub", "mul", "real_div", "pow", "maximum", "minimum", "floor_div", "mod",
    "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "logical_and", "logical_or", "logical_not", "logical_xor", "select", "band_part",
    "abs", "sign", "floor", "ceil", "round", "clip", "square", "inverse", "cumsum",
    "exp", "exp2", "log", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "atan", "erf",
    "sigmoid", "silu", "gelu", "relu", "softplus", "softsign", "clamped_relu", "leaky_relu", "elu",
    "thresholded_relu", "linear_activation", "scaled_tanh", "sigmoid_hard", "prelu",
    "coreai.blockwise_shift_scale", "coreai.dequantize",  # Core AI's per-call dequantization (lut_to_dense: 0)
)


@register_flop_rule(*ELEMENTWISE_OPS)
class ElementwiseRule(FlopRule):
    """One FLOP per output element: arithmetic, comparisons, ``select``, and every transcendental or
    activation function whatever its internal formula (``silu`` = x·σ(x) counts 1; so does Core AI's per-call
    ``scale · (data − offset1) + offset2``)."""

    name = "elementwise"

    @classmethod
    def count(cls, op, ctx):
        return {"other": _out_elements(op, ctx)}


# Per-element cost of softmax: max, subtract, exp, sum, divide.
SOFTMAX_FLOPS_PER_ELEMENT = 5


@register_flop_rule("softmax")
class SoftmaxRule(FlopRule):
    """5 FLOPs per element: max, subtract, exp, sum, divide."""

    name = "softmax"

    @classmethod
    def count(cls, op, ctx):
        return {"other": SOFTMAX_FLOPS_PER_ELEMENT * _out_elements(op, ctx)}


_REDUCTION_COST = {"reduce_sum_square": 2, "reduce_l2_norm": 2, "reduce_log_sum_exp": 3}


@register_flop_rule("reduce_mean", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_argmax",
                    "reduce_argmin", *_REDUCTION_COST)
class ReductionRule(FlopRule):
    """1 FLOP per input element (2 for ``reduce_sum_square`` / ``reduce_l2_norm``: square and add; 3 for
    ``reduce_log_sum_exp``: exp, add and the max it is stabilised with)."""

    name = "reduction"

    @classmethod
    def count(cls, op, ctx):
        x = _input(op, "x")
        n = _elements(x.tensor.shape) if x is not None else None
        if n is None:
            ctx.unsized.append(op.name)
            return {}
        return {"other": _REDUCTION_COST.get(op.kind, 1) * n}


@register_flop_rule("layer_norm", "instance_norm", "batch_norm", "l2_norm")
class NormRule(FlopRule):
    """``layer_norm``/``instance_norm``/``batch_norm``: 5 per element (mean, subtract, square-and-mean, rsqrt,
    multiply) plus 1 per element each for γ and β when given; ``l2_norm``: 3 per element (square-and-sum,
    rsqrt, multiply)."""

    name = "norm"

    @classmethod
    def count(cls, op, ctx):
        n = _out_elements(op, ctx)
        if op.type == "l2_norm":
            return {"other": 3 * n}
        affine = sum(1 for r in op.inputs if r.param in ("gamma", "beta") and not ctx.is_zero(r))
        return {"other": (5 + affine) * n}


@register_flop_rule("scaled_dot_product_attention")
class SdpaRule(FlopRule):
    """``query [.., L, E]``, ``key [.., S, E]``, ``value [.., S, Ev]`` → ``[.., L, Ev]``: Q·Kᵀ = 2·(B·H·L)·S·E
    (attention scores), P·V = 2·(B·H·L)·S·Ev (attention values), the scale and an ``attn_mask`` add 1 per score
    each and the softmax 5 per score (other)."""

    name = "sdpa"

    @classmethod
    def count(cls, op, ctx):
        q, k = _input(op, "query"), _input(op, "key")
        out = _out_elements(op, ctx)
        if q is None or k is None or not out or any(d is None for d in (*q.tensor.shape, *k.tensor.shape)):
            return {}
        rows = _elements(q.tensor.shape[:-1]) or 0  # B·H·L
        s, e = k.tensor.shape[-2], q.tensor.shape[-1]
        ev = op.outputs[0].shape[-1] or 0
        scores = rows * s
        mask = scores if _input(op, "attn_mask") is not None else 0
        return {"attention_scores": 2 * scores * e, "attention_values": 2 * scores * ev,
                "other": scores + mask + SOFTMAX_FLOPS_PER_ELEMENT * scores}


MOVEMENT_OPS = (
    "const", "read_state", "write_state", "slice_update", "gather", "gather_along_axis", "gather_nd",
    "scatter", "scatter_along_axis", "scatter_nd", "tile", "concat", "split", "stack", "slice_by_index",
    "slice_by_size", "pad", "transpose", "cast", "fill", "fill_like", "shape", "range_1d", "reverse",
    "flatten2d", "one_hot", "sliding_windows", "cond", "while_loop", "topk", "argsort", "non_zero",
    "non_maximum_suppression", "coreai.invoke", "coreai.create_token",
    "upsample_nearest_neighbor", "constexpr_lut_to_dense", "constexpr_blockwise_shift_scale",
    "constexpr_affine_dequantize", "constexpr_symmetric_dequantize", "constexpr_sparse_to_dense", "constexpr_cast",
    "constexpr_sparse_blockwise_shift_scale", "constexpr_lut_to_sparse", *sorted(VIEW_OPS),
    "coreai.lut_to_dense", "coreai.build_sparse_with_bitmask", "coreai.sparse_with_bitmask_to_dense",
)


@register_flop_rule(*MOVEMENT_OPS)
class MovementRule(FlopRule):
    """Data movement, control flow and load-time decompression: 0 FLOPs (their bytes are in the byte account)."""

    name = "movement"

    @classmethod
    def count(cls, op, ctx):
        return {}
