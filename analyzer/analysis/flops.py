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
:func:`analyzer.analysis.compression.weight_part`, the one compression uses.

Per call vs per token: a decode call consumes 1 token, a prefill call N prompt tokens
(:mod:`analyzer.ir.phase`); ``per_token`` = per call ÷ tokens per call, rounded to the nearest FLOP.
An op type with no rule counts 0 and is listed in ``unruled_op_types``; an op whose output shape is symbolic
counts 0 and is listed in ``unsized``: nothing is silently zero.
"""

from __future__ import annotations

from analyzer.analysis.flop_account import FLOP_CATEGORIES, FlopAccount, Flops, LayerFlops, OpFlops
from analyzer.analysis.flop_rules import FLOP_RULES, SOFTMAX_FLOPS_PER_ELEMENT, FlopContext, FlopRule
from analyzer.ir.mil_records import MilProgram, consumer_map

__all__ = ["FLOP_CATEGORIES", "FLOP_RULES", "SOFTMAX_FLOPS_PER_ELEMENT", "FlopAccount", "FlopContext", "FlopRule",
           "Flops", "LayerFlops", "OpFlops", "count_flops"]


def count_flops(program: MilProgram, tokens_per_call: int = 1) -> FlopAccount:
    """Count every op of ``program`` by its rule; ``tokens_per_call`` (1 for decode, N for a prefill call) turns
    per-call figures into per-token ones."""
    if isinstance(tokens_per_call, bool) or not isinstance(tokens_per_call, int) or tokens_per_call < 1:
        raise ValueError(f"tokens_per_call {tokens_per_call!r}: must be an integer ≥ 1")
    ctx = FlopContext(program, consumer_map(program.ops))
    ops: list[OpFlops] = []
    unruled: set[str] = set()
    for op in program.ops:
        rule = FLOP_RULES.get(op.kind)
        if rule is None:
            unruled.add(op.type)
            ops.append(OpFlops(op.index, op.name, op.type, op.layer, "unruled"))
            continue
        counts = rule.count(op, ctx)
        ops.append(OpFlops(op.index, op.name, op.type, op.layer, rule.name, **counts))
    return FlopAccount(tuple(ops), tokens_per_call, tuple(sorted(unruled)), tuple(ctx.unsized),
                       tuple(ctx.estimated))
