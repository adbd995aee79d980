"""FLOPs of one call of a walked program, per op, by category and by layer, from MIL shapes alone.

Conventions (every figure is an int count of floating-point operations):

* a multiply-add is 2 FLOPs: ``matmul`` = 2 · (output elements) · K, where K is the contracted size; ``linear``
  = 2 · (output elements) · (input features), plus 1 per output element for a bias that is not all zeros
  (coremltools gives every bias-free ``linear`` a zero bias); ``conv`` = 2 · (output elements) · (input
  channels per group) · (kernel elements), plus a non-zero bias; ``einsum`` likewise, with K estimated from the
  shapes (the equation is not in the walked record; listed in ``estimated``);
* elementwise arithmetic, comparisons and ``select``: 1 per output element; transcendental and activation
  functions (exp, log, rsqrt, sin, tanh, sigmoid, erf, silu, gelu, …): 1 per output element whatever their
  formula;
* ``softmax``: 5 per element (max, subtract, exp, sum, divide); reductions: 1 per input element (2 for
  ``reduce_sum_square``/``reduce_l2_norm``, 3 for ``reduce_log_sum_exp``); ``layer_norm``/``instance_norm``/
  ``batch_norm``: 5 per element plus 1 each for γ and β; ``l2_norm``: 3 per element;
  ``scaled_dot_product_attention``: its two matmuls, its mask add and its softmax;
* data movement is 0: views, ``transpose``, ``cast``, ``concat``, ``slice_*``, ``gather``, ``tile``, state
  reads/writes, ``slice_update``; compressed weights (``constexpr_*``) are decompressed at load time, 0 per call.

Categories: ``projections`` (linears/matmuls whose weight is an attention module's: q/k/v/o, fused qkv),
``attention_scores`` (Q·Kᵀ: a matmul of two activations whose output reaches a ``softmax``),
``attention_values`` (P·V: a matmul of two activations one of which comes from a ``softmax``), ``ffn`` (an MLP
module's weights), ``lm_head`` (the output projection, also when it reads the tied embedding), ``other``
(everything else: norms, RoPE, scale, mask, softmax, activations). The weight → part rule is
:func:`analyzer.graph.compression.weight_part`, the one compression uses.

Per call vs per token: a decode call consumes 1 token, a prefill call N prompt tokens
(:mod:`analyzer.graph.phase`); ``per_token`` = per call ÷ tokens per call, rounded to the nearest FLOP.
An op type with no rule counts 0 and is listed in ``unruled_op_types``; an op whose output shape is symbolic
counts 0 and is listed in ``unsized``: nothing is silently zero.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, ClassVar

from analyzer.graph.compression import weight_part
from analyzer.graph.program import VIEW_OPS, InputRef, MilProgram, OpRecord, consumer_map

FLOP_CATEGORIES: tuple[str, ...] = ("projections", "attention_scores", "attention_values", "ffn", "lm_head",
                                    "other")
# weight_part's parts → FLOP categories
_PART_CATEGORY = {"attn": "projections", "ffn": "ffn", "lm_head": "lm_head", "embed": "lm_head"}
# Ops a score tensor passes through on its way to the softmax (scale, softcap, mask add, the read-only cache's
# concat with the new token's score), and a probability tensor on its way to P·V.
_TO_SOFTMAX = VIEW_OPS | {"cast", "mul", "add", "sub", "real_div", "tanh", "concat", "select", "slice_by_index",
                          "slice_by_size", "transpose", "maximum", "minimum", "clip"}
_FROM_SOFTMAX = VIEW_OPS | {"cast", "slice_by_index", "slice_by_size", "transpose", "concat", "mul"}
_MAX_HOPS = 8


@dataclass(frozen=True, slots=True)
class OpFlops:
    """One op's FLOPs per call, by category (ints)."""

    index: int
    name: str
    type: str
    layer: int | None
    rule: str
    projections: int = 0
    attention_scores: int = 0
    attention_values: int = 0
    ffn: int = 0
    lm_head: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return sum(self.get(c) for c in FLOP_CATEGORIES)

    def get(self, category: str) -> int:
        return getattr(self, category)


@dataclass(frozen=True, slots=True)
class Flops:
    """FLOPs by category (per call or per token, as the account that made it says)."""

    projections: int
    attention_scores: int
    attention_values: int
    ffn: int
    lm_head: int
    other: int

    @property
    def total(self) -> int:
        return sum(self.get(c) for c in FLOP_CATEGORIES)

    @property
    def attention(self) -> int:
        return self.attention_scores + self.attention_values

    def get(self, key: str) -> int:
        if key == "total":
            return self.total
        if key not in FLOP_CATEGORIES:
            raise KeyError(f"no FLOP figure {key!r}")
        return getattr(self, key)

    def to_json(self) -> dict[str, int]:
        return {**{c: self.get(c) for c in FLOP_CATEGORIES}, "total": self.total}


@dataclass(frozen=True, slots=True)
class LayerFlops:
    """One decoder layer's FLOPs by category (``layer`` None: outside any decoder layer)."""

    layer: int | None
    flops: Flops

    def to_json(self) -> dict[str, int | None]:
        return {"layer": self.layer, **self.flops.to_json()}


@dataclass(frozen=True, slots=True)
class FlopAccount:
    ops: tuple[OpFlops, ...]
    tokens_per_call: int
    unruled_op_types: tuple[str, ...] = ()
    unsized: tuple[str, ...] = ()  # names of ops whose output shape is symbolic (counted 0)
    estimated: tuple[str, ...] = ()  # names of ops whose K was estimated from shapes (einsum)

    def per_call(self) -> Flops:
        return _sum(self.ops)

    def per_token(self) -> Flops:
        """Per call ÷ tokens per call (per prompt token for a prefill), rounded to the nearest FLOP."""
        return _divide(self.per_call(), self.tokens_per_call)

    def layers(self, per_token: bool = True) -> tuple[LayerFlops, ...]:
        """One row per layer, in layer order, ``None`` (outside the decoder layers) last."""
        rows: dict[int | None, list[OpFlops]] = defaultdict(list)
        for o in self.ops:
            rows[o.layer].append(o)
        order = sorted(rows, key=lambda x: (x is None, x if x is not None else 0))
        n = self.tokens_per_call if per_token else 1
        return tuple(LayerFlops(layer, _divide(_sum(rows[layer]), n)) for layer in order)

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens_per_call": self.tokens_per_call,
            "flops_per_call": self.per_call().to_json(),
            "flops_per_token": self.per_token().to_json(),
            "flops_by_layer": [r.to_json() for r in self.layers()],
            "flop_unruled_op_types": list(self.unruled_op_types),
            "flop_unsized_ops": list(self.unsized),
            "flop_estimated_ops": list(self.estimated),
        }

    def op_rows(self) -> list[dict[str, Any]]:
        return [{"index": o.index, "name": o.name, "type": o.type, "layer": o.layer, "rule": o.rule,
                 **{c: o.get(c) for c in FLOP_CATEGORIES}, "total": o.total} for o in self.ops]


def _sum(ops) -> Flops:
    return Flops(**{c: sum(o.get(c) for o in ops) for c in FLOP_CATEGORIES})


def _divide(f: Flops, n: int) -> Flops:
    return f if n == 1 else Flops(**{c: round(f.get(c) / n) for c in FLOP_CATEGORIES})


# ------------------------------------------------------------------------------------------------- context
@dataclass
class FlopContext:
    """The program being counted and the dataflow questions the rules ask of it."""

    program: MilProgram
    consumers: dict[int, list[int]] = field(default_factory=dict)
    unsized: list[str] = field(default_factory=list)
    estimated: list[str] = field(default_factory=list)

    def op(self, index: int) -> OpRecord:
        return self.program.ops[index]

    def is_weight(self, ref: InputRef) -> bool:
        if ref.is_const:
            return True
        return ref.producer is not None and self.op(ref.producer).type.startswith("constexpr_")

    def is_zero(self, ref: InputRef) -> bool:
        return ref.producer is not None and self.op(ref.producer).const_zero

    def reaches_softmax(self, index: int, hops: int = 0) -> bool:
        """Whether op ``index``'s output flows into a softmax through scale/mask/concat/view ops only."""
        if hops > _MAX_HOPS:
            return False
        for c in self.consumers.get(index, ()):
            t = self.op(c).type
            if t == "softmax" or (t in _TO_SOFTMAX and self.reaches_softmax(c, hops + 1)):
                return True
        return False

    def from_softmax(self, ref: InputRef, hops: int = 0) -> bool:
        """Whether an input comes out of a softmax through view/slice/cast ops only."""
        if ref.producer is None or hops > _MAX_HOPS:
            return False
        producer = self.op(ref.producer)
        if producer.type == "softmax":
            return True
        return producer.type in _FROM_SOFTMAX and any(
            self.from_softmax(r, hops + 1) for r in producer.inputs if not r.is_const)

    def weight_category(self, op: OpRecord, ref: InputRef) -> str:
        where = weight_part(ref.tensor.name, [op.type])
        if where is None:
            return "other"
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
)


@register_flop_rule(*ELEMENTWISE_OPS)
class ElementwiseRule(FlopRule):
    """One FLOP per output element: arithmetic, comparisons, ``select``, and every transcendental or
    activation function whatever its internal formula (``silu`` = x·σ(x) counts 1)."""

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
        return {"other": _REDUCTION_COST.get(op.type, 1) * n}


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
    "upsample_nearest_neighbor", "constexpr_lut_to_dense", "constexpr_blockwise_shift_scale",
    "constexpr_affine_dequantize", "constexpr_symmetric_dequantize", "constexpr_sparse_to_dense", "constexpr_cast",
    "constexpr_sparse_blockwise_shift_scale", "constexpr_lut_to_sparse", *sorted(VIEW_OPS),
)


@register_flop_rule(*MOVEMENT_OPS)
class MovementRule(FlopRule):
    """Data movement, control flow and load-time decompression: 0 FLOPs (their bytes are in the byte account)."""

    name = "movement"

    @classmethod
    def count(cls, op, ctx):
        return {}


def count_flops(program: MilProgram, tokens_per_call: int = 1) -> FlopAccount:
    """Count every op of ``program`` by its rule; ``tokens_per_call`` (1 for decode, N for a prefill call) turns
    per-call figures into per-token ones."""
    if isinstance(tokens_per_call, bool) or not isinstance(tokens_per_call, int) or tokens_per_call < 1:
        raise ValueError(f"tokens_per_call {tokens_per_call!r}: must be an integer ≥ 1")
    ctx = FlopContext(program, consumer_map(program.ops))
    ops: list[OpFlops] = []
    unruled: set[str] = set()
    for op in program.ops:
        rule = FLOP_RULES.get(op.type)
        if rule is None:
            unruled.add(op.type)
            ops.append(OpFlops(op.index, op.name, op.type, op.layer, "unruled"))
            continue
        counts = rule.count(op, ctx)
        ops.append(OpFlops(op.index, op.name, op.type, op.layer, rule.name, **counts))
    return FlopAccount(tuple(ops), tokens_per_call, tuple(sorted(unruled)), tuple(ctx.unsized),
                       tuple(ctx.estimated))
