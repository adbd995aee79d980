"""Logical bytes one decode token moves, by category, by layer and by op, from MIL shapes alone.

Every byte is charged to exactly one op and one category (design.md, "Byte accounting"):

=============  =================================================================================
weights        constant data a compute op reads, at its stored size (for ``constexpr_*`` weights:
               indices + LUT + scales as stored); an embedding ``gather`` reads only its rows
kv_read        KV cache bytes read by attention (the whole static cache, masked slots included)
kv_write       bytes newly written into the cache in place (``slice_update``'s update; with the
               cache as an input, the ``new_k``/``new_v`` outputs the host writes back)
replication    a ``tile`` that copies K/V for attention: its output written, plus every read of it
activations    every other non-constant tensor an op reads or writes
=============  =================================================================================

Conventions. An op reads each non-constant input once and writes each output once; a consumer that
reads through views (``reshape``, ``expand_dims``, ``squeeze``, ``identity``, ``read_state``) reads the
underlying tensor, and views move nothing. Op parameters that are attributes (shapes, axes, perms,
reps, masks, flags), rank-0 immediates and all-zero constants (coremltools gives every bias-free
``linear`` a zero bias) move nothing. ``kv_write_value_semantics`` (a whole tensor per
``slice_update``, as MIL's value semantics would have it) is reported beside the totals, not in them.

Rules live in a registry keyed by op type, one documented class per rule, in the manner of
coremltools' graph passes. An op type with no rule is charged by the generic compute rule and listed
in ``unruled_op_types``, never silently zero.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from analyzer.graph.mil import VIEW_OPS, InputRef, MilProgram, OpRecord

CATEGORIES: tuple[str, ...] = ("weights", "kv_read", "kv_write", "replication", "activations")
# Columns of the per-op byte table (``ByteAccount.op_rows``), as the CLI and the exports write it.
OP_COLUMNS: tuple[str, ...] = ("index", "name", "type", "layer", "rule", *CATEGORIES, "total",
                               "kv_write_value_semantics")

# Parameters that are attributes of the op rather than data it streams (MIL op definitions).
ATTRIBUTE_PARAMS = frozenset({
    "shape", "axes", "axis", "perm", "reps", "begin", "end", "stride", "begin_mask", "end_mask",
    "squeeze_mask", "keep_dims", "transpose_x", "transpose_y", "interleave", "dtype", "epsilon",
    "batch_dims", "validate_indices", "pad", "pad_type", "strides", "dilations", "groups", "mode",
    "split_sizes", "num_splits", "size", "alpha", "beta", "lower_bound", "upper_bound", "reverse",
    "exclusive", "k", "ascending", "sort", "return_indices", "output_dtype", "block_size",
    "align_corners", "sampling_mode", "coordinates_mode", "padding_mode", "max_val", "min_val",
})
# Program inputs that are a KV cache when it is passed in (``--kv input``) rather than held as state.
_KV_INPUT = re.compile(r"(?:^|_)(?:k|v|key|value|keys|values)_?cache|past_key|past_value", re.IGNORECASE)
_KV_OUTPUT = re.compile(r"^(?:new_k|new_v|present_key|present_value)", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class OpBytes:
    """The bytes one op moves per decode token, by category (ints, bytes)."""

    index: int
    name: str
    type: str
    layer: int | None
    rule: str
    weights: int = 0
    kv_read: int = 0
    kv_write: int = 0
    replication: int = 0
    activations: int = 0
    kv_write_value_semantics: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_read + self.kv_write + self.replication + self.activations

    def get(self, category: str) -> int:
        return getattr(self, category)


@dataclass(frozen=True, slots=True)
class ByteAccount:
    ops: tuple[OpBytes, ...]
    unruled_op_types: tuple[str, ...]

    def totals(self) -> dict[str, int]:
        out = {c: sum(o.get(c) for o in self.ops) for c in CATEGORIES}
        out["total"] = sum(out[c] for c in CATEGORIES)
        out["kv_write_value_semantics"] = sum(o.kv_write_value_semantics for o in self.ops)
        return out

    def by_layer(self) -> list[dict[str, int | None]]:
        """One row per layer (``None`` = outside any decoder layer: embedding, RoPE, lm_head)."""
        rows: dict[int | None, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CATEGORIES, 0))
        for o in self.ops:
            for c in CATEGORIES:
                rows[o.layer][c] += o.get(c)
        out = []
        for layer in sorted(rows, key=lambda x: (x is None, x if x is not None else 0)):
            r = rows[layer]
            out.append({"layer": layer, **r, "total": sum(r.values())})
        return out

    def to_json(self) -> dict:
        t = self.totals()
        return {
            "bytes_per_token": {k: t[k] for k in (*CATEGORIES, "kv_write_value_semantics", "total")},
            "bytes_by_layer": self.by_layer(),
            "unruled_op_types": list(self.unruled_op_types),
        }

    def op_rows(self) -> list[dict]:
        """One dict per op with the ``OP_COLUMNS`` keys."""
        return [
            {"index": o.index, "name": o.name, "type": o.type, "layer": o.layer, "rule": o.rule,
             **{c: o.get(c) for c in CATEGORIES}, "total": o.total,
             "kv_write_value_semantics": o.kv_write_value_semantics}
            for o in self.ops
        ]


# ------------------------------------------------------------------------------------------------- context
@dataclass
class _Context:
    program: MilProgram
    origin: dict[int, str] = field(default_factory=dict)  # op index → "kv" | "replication" | "act"

    def op(self, index: int) -> OpRecord:
        return self.program.ops[index]

    def source_kind(self, ref: InputRef) -> str:
        """What a non-constant input really is, looking through views: the KV cache, a KV replica, or an
        ordinary activation."""
        if ref.producer is None:
            return "kv" if _KV_INPUT.search(ref.tensor.name) else "act"
        return self.origin.get(ref.producer, "act")

    def weight_bytes(self, ref: InputRef, seen: frozenset[int] = frozenset()) -> int:
        """Stored bytes of the constant data behind an input (0 for attributes, scalars, zero consts)."""
        if ref.param in ATTRIBUTE_PARAMS:
            return 0
        if ref.producer is None:  # an inline value
            return ref.stored_bytes if ref.is_const and len(ref.tensor.shape) > 0 else 0
        producer = self.op(ref.producer)
        if producer.type == "const":
            if producer.const_zero or len(ref.tensor.shape) == 0 or producer.outputs[0].dtype == "string":
                return 0
            return producer.const_bytes
        if producer.type.startswith("constexpr_") and producer.index not in seen:
            # a compressed weight: everything stored that the decompression reads
            return sum(self.weight_bytes(r, seen | {producer.index}) for r in producer.inputs)
        return 0

    def is_weight(self, ref: InputRef) -> bool:
        if ref.is_const:
            return True
        return ref.producer is not None and self.op(ref.producer).type.startswith("constexpr_")


# ------------------------------------------------------------------------------------------------- rules
RULES: dict[str, type[ByteRule]] = {}


def register_rule(*op_types: str):
    def deco(cls: type[ByteRule]) -> type[ByteRule]:
        for t in op_types:
            if t in RULES:
                raise ValueError(f"byte rule for {t!r} registered twice")
            RULES[t] = cls
        cls.op_types = op_types
        return cls

    return deco


class ByteRule:
    """Charge one op's bytes. ``account`` returns the op's :class:`OpBytes`; ``origin`` says what the
    op's output is for the ops that read it ("kv", "replication" or "act")."""

    name: ClassVar[str]
    op_types: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def origin(cls, op: OpRecord, ctx: _Context) -> str:
        return "act"

    @classmethod
    def account(cls, op: OpRecord, ctx: _Context) -> OpBytes:
        raise NotImplementedError


def _charge_reads(refs: Iterable[InputRef], ctx: _Context, counts: dict[str, int]) -> None:
    for ref in refs:
        if ctx.is_weight(ref):
            counts["weights"] += ctx.weight_bytes(ref)
            continue
        n = ref.tensor.nbytes or 0
        kind = ctx.source_kind(ref)
        counts["kv_read" if kind == "kv" else "replication" if kind == "replication" else "activations"] += n


def _op_bytes(op: OpRecord, rule: str, counts: dict[str, int], **extra: int) -> OpBytes:
    return OpBytes(op.index, op.name, op.type, op.layer, rule, **counts, **extra)


def _empty() -> dict[str, int]:
    return dict.fromkeys(CATEGORIES, 0)


@register_rule("const")
class ConstRule(ByteRule):
    """A constant moves nothing where it is defined; its data is charged to the ops that read it."""

    name = "const"

    @classmethod
    def account(cls, op, ctx):
        return _op_bytes(op, cls.name, _empty())


@register_rule(
    "constexpr_lut_to_dense", "constexpr_blockwise_shift_scale", "constexpr_affine_dequantize",
    "constexpr_symmetric_dequantize", "constexpr_sparse_to_dense", "constexpr_cast",
    "constexpr_sparse_blockwise_shift_scale", "constexpr_lut_to_sparse",
)
class ConstexprRule(ByteRule):
    """Compressed weights are decompressed at load time; the stored parts (indices, LUT, scales, offsets)
    are charged as ``weights`` to the op that reads the dense weight."""

    name = "constexpr"

    @classmethod
    def account(cls, op, ctx):
        return _op_bytes(op, cls.name, _empty())


@register_rule(*sorted(VIEW_OPS), "read_state")
class ViewRule(ByteRule):
    """``reshape`` / ``expand_dims`` / ``squeeze`` / ``identity`` re-label a tensor and ``read_state``
    names the state buffer: they move nothing; readers of their output read what they view."""

    name = "view"

    @classmethod
    def origin(cls, op, ctx):
        if op.type == "read_state":
            return "kv"
        src = next((r for r in op.inputs if r.param in ("x", "input") and not r.is_const), None)
        return ctx.source_kind(src) if src is not None else "act"

    @classmethod
    def account(cls, op, ctx):
        return _op_bytes(op, cls.name, _empty())


@register_rule("write_state")
class WriteStateRule(ByteRule):
    """Commits the ``slice_update`` result to the state. Core ML updates the buffer in place, so the
    bytes are already charged as ``kv_write`` to the ``slice_update``."""

    name = "write_state"

    @classmethod
    def account(cls, op, ctx):
        return _op_bytes(op, cls.name, _empty())


@register_rule("slice_update")
class SliceUpdateRule(ByteRule):
    """On a KV cache (its ``x`` is the state): an in-place write of ``update`` (``kv_write``), which is read
    as an activation; the cache itself is neither read nor copied. The whole-tensor write MIL's value
    semantics would imply is reported as ``kv_write_value_semantics``. On anything else: generic compute."""

    name = "slice_update"

    @classmethod
    def origin(cls, op, ctx):
        x = next((r for r in op.inputs if r.param == "x"), None)
        return "kv" if x is not None and ctx.source_kind(x) == "kv" else "act"

    @classmethod
    def account(cls, op, ctx):
        x = next((r for r in op.inputs if r.param == "x"), None)
        if x is None or ctx.source_kind(x) != "kv":
            return ComputeRule.account(op, ctx)
        counts = _empty()
        update = next(r for r in op.inputs if r.param == "update")
        counts["kv_write"] = update.tensor.nbytes or 0
        for ref in op.inputs:
            if ref.param == "x":
                continue
            if ctx.is_weight(ref):
                counts["weights"] += ctx.weight_bytes(ref)
            else:
                counts["activations"] += ref.tensor.nbytes or 0
        return _op_bytes(op, cls.name, counts, kv_write_value_semantics=op.output_bytes)


@register_rule("tile")
class TileRule(ByteRule):
    """A ``kv_replication`` tile reads the cache (``kv_read``) and writes G copies of it
    (``replication``); its readers' reads are ``replication`` too. Other tiles are generic compute."""

    name = "tile"

    @classmethod
    def origin(cls, op, ctx):
        return "replication" if op.tile_kind == "kv_replication" else "act"

    @classmethod
    def account(cls, op, ctx):
        if op.tile_kind != "kv_replication":
            return ComputeRule.account(op, ctx)
        counts = _empty()
        _charge_reads(op.inputs, ctx, counts)
        counts["replication"] += op.output_bytes
        return _op_bytes(op, cls.name, counts)


@register_rule("gather", "gather_along_axis", "gather_nd")
class GatherRule(ByteRule):
    """Reads its indices and, from a constant table (an embedding), only the gathered rows: the stored
    table bytes × rows gathered / rows in the table (for a palettized table, the same share of indices
    and LUT). Writes the gathered rows."""

    name = "gather"

    @classmethod
    def account(cls, op, ctx):
        counts = _empty()
        table = next((r for r in op.inputs if r.param == "x"), None)
        indices = next((r for r in op.inputs if r.param == "indices"), None)
        fraction = 1.0
        if table is not None and ctx.is_weight(table) and indices is not None and table.tensor.shape:
            rows = table.tensor.shape[0] or 1
            n_idx = 1
            for d in indices.tensor.shape:
                n_idx *= d or 1
            fraction = min(1.0, n_idx / rows)
        if table is not None and ctx.is_weight(table):
            counts["weights"] += round(ctx.weight_bytes(table) * fraction)
        _charge_reads((r for r in op.inputs if r is not table or not ctx.is_weight(r)), ctx, counts)
        counts["activations"] += op.output_bytes
        return _op_bytes(op, cls.name, counts)


# Core ML compute ops charged by the generic rule (reads once, writes once).
COMPUTE_OPS = (
    "linear", "matmul", "einsum", "conv", "conv_transpose",
    "add", "sub", "mul", "real_div", "pow", "maximum", "minimum", "floor_div", "mod",
    "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
    "logical_and", "logical_or", "logical_not", "logical_xor", "select",
    "abs", "exp", "exp2", "log", "sqrt", "rsqrt", "inverse", "square", "sign", "floor", "ceil", "round", "clip",
    "sin", "cos", "tan", "tanh", "atan", "erf", "sigmoid", "silu", "gelu", "relu", "softplus", "softsign",
    "softmax", "layer_norm", "instance_norm", "batch_norm", "l2_norm",
    "reduce_mean", "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_l2_norm",
    "reduce_sum_square", "reduce_argmax", "reduce_argmin", "reduce_log_sum_exp",
    "cast", "transpose", "concat", "split", "stack", "slice_by_index", "slice_by_size", "pad",
    "scatter", "scatter_along_axis", "scatter_nd", "range_1d", "fill", "fill_like", "shape", "cumsum",
    "topk", "argsort", "band_part", "scaled_dot_product_attention", "clamped_relu", "leaky_relu", "elu",
    "thresholded_relu", "linear_activation", "scaled_tanh", "sigmoid_hard", "prelu", "reverse", "flatten2d",
    "sliding_windows", "one_hot", "non_zero", "non_maximum_suppression", "upsample_nearest_neighbor",
)


@register_rule(*COMPUTE_OPS)
class ComputeRule(ByteRule):
    """Reads every non-constant input once (from the KV cache: ``kv_read``; from a KV replica:
    ``replication``; else ``activations``), reads its constant data (``weights``) and writes its
    outputs (``activations``)."""

    name = "compute"

    @classmethod
    def account(cls, op, ctx):
        counts = _empty()
        _charge_reads(op.inputs, ctx, counts)
        out = op.output_bytes
        if any(_KV_OUTPUT.search(t.name) for t in op.outputs):
            counts["kv_write"] += out  # the new k/v the host writes into its cache (``--kv input``)
        else:
            counts["activations"] += out
        return _op_bytes(op, cls.name, counts)


# ------------------------------------------------------------------------------------------------- entry
def account(program: MilProgram) -> ByteAccount:
    ctx = _Context(program)
    ops: list[OpBytes] = []
    unruled: set[str] = set()
    for op in program.ops:
        rule = RULES.get(op.type)
        if rule is None:
            unruled.add(op.type)
            rule = ComputeRule
        ctx.origin[op.index] = rule.origin(op, ctx)
        ops.append(rule.account(op, ctx))
    return ByteAccount(tuple(ops), tuple(sorted(unruled)))
