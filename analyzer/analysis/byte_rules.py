"""The byte rules: one documented class per kind of op, registered by op type (in the manner of
coremltools' graph passes), and the context they read the program through.

Conventions (the module docstring of :mod:`analyzer.analysis.accounting` has the categories): an op reads each
non-constant input once and writes each output once; a consumer that reads through views (``reshape``,
``expand_dims``, ``squeeze``, ``identity``, ``read_state``) reads the underlying tensor, and views move
nothing. Op parameters that are attributes (shapes, axes, perms, reps, masks, flags), rank-0 immediates
and all-zero constants (coremltools gives every bias-free ``linear`` a zero bias) move nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from analyzer.analysis.byte_account import CATEGORIES, DEFAULT_WEIGHT_CHARGE, OpBytes, WeightCharge
from analyzer.ir.coreai.dialect import PER_CALL_DECOMPRESSION
from analyzer.ir.mil_records import VIEW_OPS, InputRef, MilProgram, OpRecord

# Parameters that are attributes of the op rather than data it streams (MIL op definitions, coremltools
# 9.0 ``mil/ops/defs``). ``alpha`` and ``beta`` are not among them: as scalars (``leaky_relu``, ``elu``,
# ``clip``) the rank-0 rule already makes them free, and as tensors they are weights (PReLU's per-channel
# ``alpha``, LayerNorm's ``beta`` beside its ``gamma``).
ATTRIBUTE_PARAMS = frozenset({
    "shape", "axes", "axis", "perm", "reps", "begin", "end", "stride", "begin_mask", "end_mask",
    "squeeze_mask", "keep_dims", "transpose_x", "transpose_y", "interleave", "dtype", "epsilon",
    "batch_dims", "validate_indices", "pad", "pad_type", "strides", "dilations", "groups", "mode",
    "split_sizes", "num_splits", "size", "lower_bound", "upper_bound", "reverse",
    "exclusive", "k", "ascending", "sort", "return_indices", "output_dtype", "block_size",
    "align_corners", "sampling_mode", "coordinates_mode", "padding_mode", "max_val", "min_val",
    "dim_sizes",  # Core AI broadcast_in_dims(input, dim_sizes, axes): the sizes the axes are broadcast to
})
# Program inputs that are a KV cache when it is passed in (``--kv input``) rather than held as state.
_KV_INPUT = re.compile(r"(?:^|_)(?:k|v|key|value|keys|values)_?cache|past_key|past_value", re.IGNORECASE)
_KV_OUTPUT = re.compile(r"^(?:new_k|new_v|present_key|present_value)", re.IGNORECASE)


@dataclass
class ByteContext:
    """The program being accounted, what each op's output is for its readers, and the weight charge."""

    program: MilProgram
    weight_charge: WeightCharge = DEFAULT_WEIGHT_CHARGE
    origin: dict[int, str] = field(default_factory=dict)  # op index → "kv" | "replication" | "act"

    def op(self, index: int) -> OpRecord:
        return self.program.ops[index]

    def source_kind(self, ref: InputRef) -> str:
        """What a non-constant input really is, looking through views: the KV cache, a KV replica, or an
        ordinary activation."""
        if ref.producer is None:
            return "kv" if _KV_INPUT.search(ref.tensor.name) else "act"
        return self.origin.get(ref.producer, "act")

    def load_time(self, op: OpRecord) -> bool:
        """Whether ``op`` decompresses a weight once, at load, for this account: Core ML's ``constexpr_*`` ops
        always; Core AI's decompression ops (run on every call: ``dialect.PER_CALL_DECOMPRESSION``) only with the
        ``decompressed`` weight charge, which charges every compressed weight as decompressed once at load."""
        return op.type.startswith("constexpr_") or (self.weight_charge == "decompressed"
                                                     and op.type in PER_CALL_DECOMPRESSION)

    def weight_bytes(self, ref: InputRef, seen: frozenset[int] = frozenset()) -> int:
        """Bytes of the constant data behind an input, as the weight charge counts them: as stored, or for a
        compressed weight with ``decompressed`` the dense tensor; 0 for attributes, scalars and zero consts."""
        if ref.param in ATTRIBUTE_PARAMS:
            return 0
        if ref.producer is None:  # an inline value
            return ref.stored_bytes if ref.is_const and len(ref.tensor.shape) > 0 else 0
        producer = self.op(ref.producer)
        if producer.kind == "const":
            if producer.const_zero or len(ref.tensor.shape) == 0 or ref.tensor.dtype == "string":
                return 0
            return producer.const_bytes
        if self.load_time(producer) and producer.index not in seen:
            if self.weight_charge == "decompressed" and not seen:
                return ref.tensor.nbytes or 0  # the dense tensor made at load time
            # a compressed weight: everything stored that the decompression reads
            return sum(self.weight_bytes(r, seen | {producer.index}) for r in producer.inputs)
        return 0

    def stored_bytes(self, ref: InputRef, seen: frozenset[int] = frozenset()) -> int:
        """Bytes the program stores for the weight behind an input, whatever the weight charge: a constant's own,
        or everything stored that its decompression (``constexpr_*`` or Core AI's per-call ops, and the casts
        between them) reads; 0 for attributes, scalars and zero consts."""
        if ref.producer is None or ref.param in ATTRIBUTE_PARAMS:
            return self.weight_bytes(ref)
        producer = self.op(ref.producer)
        if producer.kind == "const":
            return self.weight_bytes(ref)
        if producer.index not in seen and is_decompression(producer, self.program):
            return sum(self.stored_bytes(r, seen | {producer.index}) for r in producer.inputs)
        return 0

    def is_weight(self, ref: InputRef) -> bool:
        if ref.is_const:
            return True
        return ref.producer is not None and self.load_time(self.op(ref.producer))


def is_decompression(op: OpRecord, program: MilProgram) -> bool:
    """A ``constexpr_*`` op, a Core AI decompression op, or a cast inside a chain of them (coreai-opt casts a
    quantized LUT's dense output to float before scaling it)."""
    if op.type.startswith("constexpr_") or op.type in PER_CALL_DECOMPRESSION:
        return True
    return op.kind == "cast" and any(r.producer is not None and program.ops[r.producer].type in PER_CALL_DECOMPRESSION
                                     for r in op.inputs)


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
    def origin(cls, op: OpRecord, ctx: ByteContext) -> str:
        return "act"

    @classmethod
    def account(cls, op: OpRecord, ctx: ByteContext) -> OpBytes:
        raise NotImplementedError


def _charge_reads(refs: Iterable[InputRef], ctx: ByteContext, counts: dict[str, int]) -> None:
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
    """A compressed weight moves nothing where it is decompressed; the op that reads the dense weight is
    charged for it as ``weights``: its stored parts (indices, LUT, scales, offsets) with the ``compressed``
    weight charge (the default), the dense tensor with ``decompressed`` (``byte_account.WeightCharge``)."""

    name = "constexpr"

    @classmethod
    def account(cls, op, ctx):
        return _op_bytes(op, cls.name, _empty())


@register_rule(*sorted(PER_CALL_DECOMPRESSION))
class DecompressRule(ByteRule):
    """Core AI's weight decompression (``lut_to_dense``, ``blockwise_shift_scale``, ...), which Apple's runtime runs
    on every call (``analyzer.ir.coreai.dialect``): reads what is stored (indices, LUT, scales, offsets: ``weights``,
    as stored; a zero offset is free) and writes the dense weight (``activations``), which the op that reads the
    weight reads again (``activations``). With the ``decompressed`` weight charge it is done once at load instead:
    free, and its reader is charged the dense tensor as ``weights`` (``ByteContext.load_time``)."""

    name = "decompress"

    @classmethod
    def account(cls, op, ctx):
        counts = _empty()
        if ctx.load_time(op):
            return _op_bytes(op, cls.name, counts)
        _charge_reads(op.inputs, ctx, counts)
        counts["activations"] += op.output_bytes
        return _op_bytes(op, cls.name, counts)


@register_rule(*sorted(VIEW_OPS), "read_state")
class ViewRule(ByteRule):
    """``reshape`` / ``expand_dims`` / ``squeeze`` / ``identity`` re-label a tensor and ``read_state``
    names the state buffer: they move nothing; readers of their output read what they view."""

    name = "view"

    @classmethod
    def origin(cls, op, ctx):
        if op.kind == "read_state":
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


@register_rule("cond", "while_loop", "coreai.invoke", "coreai.create_token")
class ControlFlowRule(ByteRule):
    """``cond`` and ``while_loop`` hold nested blocks whose ops are accounted one by one (once each: a loop's
    trip count is not in the graph); the control-flow op itself moves nothing of its own. So does a Core AI
    ``invoke`` (the walker inlines the called graph's ops per call) and ``create_token`` (orders state accesses)."""

    name = "control_flow"

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
        update = next((r for r in op.inputs if r.param == "update"), None)
        if update is None:
            return ComputeRule.account(op, ctx)
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
    """A ``kv_replication`` copy reads the cache (``kv_read``) and writes G copies of it (``replication``), reading a
    gather's index for it (``replication``); its readers' reads are ``replication`` too. It charges every copy of
    K/V heads, whatever op makes it: a tile, a ``gather`` whose index repeats heads, a ``concat`` of one tensor G
    times (``accounting.account`` gives it every op the walk classified ``kv_replication``). Other tiles are generic
    compute."""

    name = "tile"

    @classmethod
    def origin(cls, op, ctx):
        return "replication" if op.tile_kind == "kv_replication" else "act"

    @classmethod
    def account(cls, op, ctx):
        if op.tile_kind != "kv_replication":
            return ComputeRule.account(op, ctx)
        counts = _empty()
        # the source is read once (a concat names it G times); a gather's index is read only to make the copy (a
        # Core AI gather_along_axis's is as large as the copy: [1, Hq, S, D] int32), so it is replication too
        data = {r.tensor.name: r for r in op.inputs if r.param != "indices"}
        _charge_reads(data.values(), ctx, counts)
        counts["replication"] += op.output_bytes + sum(r.tensor.nbytes or 0 for r in op.inputs if r.param == "indices")
        return _op_bytes(op, cls.name, counts)


@register_rule("gather", "gather_along_axis", "gather_nd")
class GatherRule(ByteRule):
    """Reads its indices and, from a constant table (an embedding), only the gathered rows: the stored
    table bytes × rows gathered / rows in the table (for a palettized table, the same share of indices
    and LUT); from a table Core AI decompresses on every call, the same share of the dense table (activations;
    the decompression itself is charged the whole table, :class:`DecompressRule`). Writes the gathered rows."""

    name = "gather"

    @classmethod
    def account(cls, op, ctx):
        counts = _empty()
        table = next((r for r in op.inputs if r.param == "x"), None)
        indices = next((r for r in op.inputs if r.param == "indices"), None)
        fraction = 1.0
        # a table decompressed on every call (Core AI): the gather still reads only its rows of the dense table
        per_call = (table is not None and table.producer is not None
                    and ctx.op(table.producer).type in PER_CALL_DECOMPRESSION and not ctx.is_weight(table))
        if table is not None and (ctx.is_weight(table) or per_call) and indices is not None and table.tensor.shape:
            rows = table.tensor.shape[0] or 1
            n_idx = 1
            for d in indices.tensor.shape:
                n_idx *= d or 1
            fraction = min(1.0, n_idx / rows)
        if table is not None and ctx.is_weight(table):
            counts["weights"] += round(ctx.weight_bytes(table) * fraction)
        elif per_call:
            counts["activations"] += round((table.tensor.nbytes or 0) * fraction)
        _charge_reads((r for r in op.inputs if r is not table or not (ctx.is_weight(r) or per_call)), ctx, counts)
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
