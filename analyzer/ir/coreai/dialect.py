"""What each Core AI op is in MIL's terms, so one set of byte and FLOP rules reads both backends' programs.

An op record of a walked ``.aimodel`` keeps its Core AI name as its ``type`` (``coreai.broadcast_in_dims``); its
``kind`` (``OpRecord.kind``) is the MIL op with the same data movement and arithmetic, which is what the rules are
registered under, and its operands are named as that MIL op names them (``x``, ``y``, ``update``, ``shape``,
``perm``, ``reps``, ...), so attribute operands (shapes, permutations, axes, indices of a slice) are free as in
MIL. Operand order is the Core AI dialect's own (coreai-core 1.0.0b3, the ``coreai._compiler.dialects.coreai``
op classes: ``SliceUpdateOp(input, start_indices, end_indices, strides, update)``, ``ConcatOp(dimension, inputs)``,
``BroadcastInDimsOp(input, dim_sizes, axes)``, ...). An op not listed keeps its own name as its kind: it is
charged by the generic compute rule and listed as unruled, never silently free.

Compressed weights (coreai-opt 0.4.0's ``coreai_utils`` passes, or coreai-torch's lowering of its custom ops,
``coreai_torch/_custom_to_core.py``) are constants read by a decompression op: ``lut_to_dense(indices, lut, axis)``
(palettized: sub-byte indices and a LUT per block of channels), ``blockwise_shift_scale(data, scale, offset1,
offset2)`` (``scale · (data − offset1) + offset2`` per block: linear quantization, or a quantized LUT's scale),
``dequantize`` (per tensor or axis) and ``sparse_with_bitmask_to_dense``. Unlike Core ML's ``constexpr_*`` ops they
are ordinary ops: the dialect says "this op is not folded at compile time; decompression happens at model load or
runtime" (coreai-core 1.0.0b3, ``LutToDenseOp``), and Apple's Linux runtime runs every one of them on every call
(profiled: one ``call.coreai.lut_to_dense`` / ``call.coreai.blockwise_shift_scale`` event per op per call,
tests/test_coreai_compression.py). They keep their own names as kinds (:data:`PER_CALL_DECOMPRESSION`), and the
byte rules charge them as compute that runs per call (``analyzer.analysis.byte_rules.DecompressRule``).

``coreai.broadcast_in_dims``, ``broadcast_to`` and ``tile`` all materialise copies, so their kind is ``tile``: the
replication classifier decides which of them copy KV heads for attention. ``read_handle`` / ``write_handle`` are a
state's read and write (MIL ``read_state`` / ``write_state``). ``create_token`` (orders state accesses) and
``invoke`` (calls a graph, whose body the walker inlines per call) move no data.
"""

from __future__ import annotations

_BINARY = ("x", "y")
_UNARY = ("x",)
_ELEMENTWISE_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "divide": "real_div", "pow": "pow",
                       "maximum": "maximum", "minimum": "minimum", "floor_divide": "floor_div", "modulo": "mod",
                       "equal": "equal", "not_equal": "not_equal", "greater": "greater", "and": "logical_and",
                       "or": "logical_or", "xor": "logical_xor", "bitwise_and": "logical_and",
                       "bitwise_or": "logical_or"}  # bitwise on bool masks (HF's mask code): MIL's logical ops
_ELEMENTWISE_UNARY = ("abs", "exp", "log", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "atan", "erf", "round",
                      "sigmoid", "silu", "relu")

# Core AI op → (MIL kind, operand names in MIL's terms, in the Core AI operand order; a trailing "*" name takes
# every remaining operand).
OPS: dict[str, tuple[str, tuple[str, ...]]] = {
    "coreai.constant": ("const", ()),
    "coreai.reshape": ("reshape", ("x", "shape")),
    "coreai.expand_dims": ("expand_dims", ("x", "axes")),
    "coreai.shrink_dims": ("squeeze", ("x", "axes")),
    "coreai.transpose": ("transpose", ("x", "perm")),
    "coreai.cast": ("cast", ("x",)),
    "coreai.batch_matmul": ("matmul", _BINARY),
    "coreai.decomposable.broadcasting_batch_matmul": ("matmul", _BINARY),
    "coreai.softmax": ("softmax", ("x", "axis")),
    "coreai.gelu": ("gelu", ("x", "mode")),
    "coreai.concat": ("concat", ("axis", "values*")),
    "coreai.slice": ("slice_by_index", ("x", "begin", "end", "stride")),
    "coreai.slice_update": ("slice_update", ("x", "begin", "end", "stride", "update")),
    "coreai.gather_nd": ("gather", ("x", "indices")),  # an embedding lookup: rows of a table, as MIL's gather
    "coreai.gather_along_axis": ("gather_along_axis", ("x", "indices", "axis")),
    "coreai.scatter_nd": ("scatter_nd", ("data", "indices", "updates")),
    "coreai.tile": ("tile", ("x", "reps")),
    "coreai.broadcast_in_dims": ("tile", ("x", "dim_sizes", "axes")),  # not MIL's reps: sizes at the axes
    "coreai.broadcast_to": ("tile", ("x", "shape")),
    "coreai.where": ("select", ("cond", "a", "b")),
    "coreai.decomposable.broadcasting_where": ("select", ("cond", "a", "b")),
    "coreai.range": ("range_1d", ("start", "end", "step")),
    "coreai.get_shape": ("shape", ("x",)),
    "coreai.pad": ("pad", ("x", "pad", "constant_val", "mode")),
    "coreai.split": ("split", ("x", "split_sizes", "axis")),
    "coreai.read_handle": ("read_state", ("input",)),
    "coreai.write_handle": ("write_state", ("input", "data")),
    "coreai.create_token": ("coreai.create_token", ()),
    "coreai.lut_to_dense": ("coreai.lut_to_dense", ("indices", "lut", "axis")),
    "coreai.blockwise_shift_scale": ("coreai.blockwise_shift_scale", ("data", "scale", "offset1", "offset2")),
    "coreai.dequantize": ("coreai.dequantize", ("data", "scale", "offset1", "offset2", "axis")),
    "coreai.build_sparse_with_bitmask": ("coreai.build_sparse_with_bitmask", ("values", "bitmask")),
    "coreai.sparse_with_bitmask_to_dense": ("coreai.sparse_with_bitmask_to_dense", ("data",)),
    "coreai.invoke": ("coreai.invoke", ("args*",)),
    **{f"coreai.reduce_{r}": (f"reduce_{'prod' if r == 'product' else r}", ("x", "axes"))
       for r in ("mean", "sum", "max", "min", "product")},
    **{f"coreai.{op}": (mil, _BINARY) for op, mil in _ELEMENTWISE_BINARY.items()},
    **{f"coreai.decomposable.broadcasting_{op}": (mil, _BINARY) for op, mil in _ELEMENTWISE_BINARY.items()},
    **{f"coreai.{op}": (op, _UNARY) for op in _ELEMENTWISE_UNARY},
}
KINDS: dict[str, str] = {op: kind for op, (kind, _) in OPS.items()}
# Ops that turn stored (compressed) weights into a dense tensor, run on every call (module docstring).
PER_CALL_DECOMPRESSION = frozenset({"coreai.lut_to_dense", "coreai.blockwise_shift_scale", "coreai.dequantize",
                                    "coreai.build_sparse_with_bitmask", "coreai.sparse_with_bitmask_to_dense"})
# Ops that only carry the graph's structure: they are not op records (their operands are the graph's results).
TERMINATORS = frozenset({"coreai.output", "coreai.yield"})


def kind_of(op_type: str) -> str:
    """The MIL op a Core AI op moves data like (``coreai.decomposable.broadcasting_mul`` → ``mul``); any other
    type (every MIL op, an unlisted Core AI op) is its own kind."""
    return KINDS.get(op_type, op_type)


def operand_names(op_type: str, n: int) -> tuple[str, ...]:
    """Names for the ``n`` data operands of a Core AI op (tokens are not operands here), as MIL names them;
    ``operand<i>`` where the table has none."""
    names = OPS.get(op_type, ("", ()))[1]
    out = []
    for i in range(n):
        if i < len(names) and not names[i].endswith("*"):
            out.append(names[i])
        elif names and names[-1].endswith("*") and i >= len(names) - 1:
            out.append(names[-1][:-1])
        else:
            out.append(f"operand{i}")
    return tuple(out)
