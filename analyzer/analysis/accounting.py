"""Logical bytes one decode token moves, by category, by layer and by op, from MIL shapes alone.

Every byte is charged to exactly one op and one category:

=============  =================================================================================
weights        constant data a compute op reads, at its stored size (for ``constexpr_*`` weights:
               indices + LUT + scales as stored, or the dense tensor with
               ``weight_charge="decompressed"``); an embedding ``gather`` reads only its rows
kv_read        KV cache bytes read by attention (the whole static cache, masked slots included)
kv_write       bytes newly written into the cache in place (``slice_update``'s update; with the
               cache as an input, the ``new_k``/``new_v`` outputs the host writes back)
replication    a copy of K/V for attention (MIL ``tile``, Core AI ``broadcast_in_dims`` / ``tile``): its
               output written, plus every read of it
activations    every other non-constant tensor an op reads or writes
=============  =================================================================================

The conventions (views, attributes, zero constants) and one class per rule are in
:mod:`analyzer.analysis.byte_rules`. ``kv_write_value_semantics`` (a whole tensor per ``slice_update``, as MIL's
value semantics would have it) is reported beside the totals, not in them. Nothing is silently zero: an op
type with no rule is charged by the generic compute rule and listed in ``unruled_op_types``, and a tensor
whose size the graph does not fix (a symbolic dimension) is listed in ``unsized``.
"""

from __future__ import annotations

from analyzer.analysis.byte_account import (
    CATEGORIES,
    DEFAULT_WEIGHT_CHARGE,
    OP_COLUMNS,
    WEIGHT_CHARGES,
    ByteAccount,
    BytesPerToken,
    LayerBytes,
    OpBytes,
    UnsizedTensor,
    WeightCharge,
    split_by_bytes,
)
from analyzer.analysis.byte_rules import ATTRIBUTE_PARAMS, COMPUTE_OPS, RULES, ByteContext, ByteRule, ComputeRule
from analyzer.ir.mil_records import MilProgram, OpRecord

__all__ = ["ATTRIBUTE_PARAMS", "CATEGORIES", "COMPUTE_OPS", "DEFAULT_WEIGHT_CHARGE", "OP_COLUMNS", "RULES",
           "WEIGHT_CHARGES", "ByteAccount", "ByteContext", "ByteRule", "BytesPerToken", "LayerBytes", "OpBytes",
           "UnsizedTensor", "WeightCharge", "account", "split_by_bytes"]

# Rules whose ops move nothing of their own: an unsized tensor there costs nothing either.
_FREE_RULES = frozenset({"const", "constexpr", "view", "write_state", "control_flow"})


def _unsized(op: OpRecord, ctx: ByteContext) -> list[UnsizedTensor]:
    """The tensors an op reads (data, not attributes or weights) or writes that have no size (strings are
    names and modes, not data)."""
    tensors = [r.tensor for r in op.inputs if r.param not in ATTRIBUTE_PARAMS and not ctx.is_weight(r)]
    return [UnsizedTensor(op.index, op.name, t.name, t.shape_text, t.dtype)
            for t in (*tensors, *op.outputs) if t.nbytes is None and t.dtype != "string"]


def account(program: MilProgram, weight_charge: WeightCharge = DEFAULT_WEIGHT_CHARGE) -> ByteAccount:
    """Charge every op of ``program`` by its rule; ``weight_charge`` says how compressed weights count."""
    if weight_charge not in WEIGHT_CHARGES:
        raise ValueError(f"weight_charge {weight_charge!r}: choose one of {', '.join(WEIGHT_CHARGES)}")
    ctx = ByteContext(program, weight_charge)
    ops: list[OpBytes] = []
    unruled: set[str] = set()
    unsized: list[UnsizedTensor] = []
    for op in program.ops:
        # a copy of K/V heads is replication whatever op makes it (a tile, a repeating gather or concat)
        rule = RULES["tile"] if op.tile_kind == "kv_replication" else RULES.get(op.kind)
        if rule is None:
            unruled.add(op.type)
            rule = ComputeRule
        ctx.origin[op.index] = rule.origin(op, ctx)
        ops.append(rule.account(op, ctx))
        if rule.name not in _FREE_RULES:
            unsized += _unsized(op, ctx)
    return ByteAccount(tuple(ops), tuple(sorted(unruled)), tuple(unsized), weight_charge)
