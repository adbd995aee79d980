"""The walked program as typed records: one :class:`OpRecord` per MIL op, tensors with shapes and sizes.

Shapes are logical MIL tensor shapes; ``nbytes`` is elements × dtype bits / 8 rounded up, or None when a
dimension is symbolic (a flexible input shape) or the type has no size (a list, a string). Readers that
charge bytes report such tensors instead of counting them as 0 (``accounting.ByteAccount.unsized``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from analyzer.ir.coreai.dialect import kind_of

# Bits per element of MIL dtypes (proto enum names, lower-cased without the FLOAT/INT spelling).
DTYPE_BITS: dict[str, int] = {
    "fp16": 16, "fp32": 32, "fp64": 64, "bf16": 16, "fp8e4m3fn": 8, "fp8e5m2": 8, "fp8e8m0fnu": 8, "fp4e2m1fn": 4,
    "int1": 1, "int2": 2, "int3": 3, "int4": 4, "int6": 6, "int8": 8, "int16": 16, "int32": 32, "int64": 64,
    "uint1": 1, "uint2": 2, "uint3": 3, "uint4": 4, "uint6": 6, "uint8": 8, "uint16": 16, "uint32": 32,
    "uint64": 64, "bool": 8,
}

# Ops that only re-label a tensor: in Core ML they move no data (the conventions of analyzer/analysis/accounting.py).
VIEW_OPS = frozenset({"reshape", "expand_dims", "squeeze", "identity"})


def tensor_nbytes(shape: tuple[int | None, ...], dtype: str) -> int | None:
    """Elements × bits / 8, rounded up; None for a symbolic dimension or a dtype without a size."""
    bits = DTYPE_BITS.get(dtype)
    if bits is None or any(d is None for d in shape):
        return None
    n = 1
    for d in shape:
        n *= d  # type: ignore[operator]
    return (n * bits + 7) // 8


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int | None, ...]  # None marks a symbolic dimension
    dtype: str  # "fp16", "int32", "uint4", ... ("string", "list", ... for non-tensors)
    nbytes: int | None  # logical size; None when a dimension is symbolic or the dtype has no size

    @property
    def shape_text(self) -> str:
        return "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"

    @property
    def symbolic(self) -> bool:
        return any(d is None for d in self.shape)


@dataclass(frozen=True, slots=True)
class IndexProfile:
    """What a Core AI gather's constant index selects (``analyzer.ir.coreai.index_profile``, read by the walk): for a
    ``gather_along_axis``, the index's value at each position of ``axis`` (it is the same at every position of the
    other axes: coreai-torch's ``index_select``); for a ``gather_nd``, ``axis`` None and ``values`` its rows,
    flattened. ``values`` None when they could not be read, and ``why``."""

    axis: int | None
    values: tuple[int, ...] | None
    why: str = ""


@dataclass(frozen=True, slots=True)
class InputRef:
    param: str  # the op's input parameter ("x", "weight", "reps", ...)
    tensor: TensorInfo
    producer: int | None  # index of the op that produces it; None for program/block inputs, states, immediates
    is_const: bool  # produced by a const op or given inline as a value
    stored_bytes: int  # for constants, the bytes as stored (blob size or immediate); 0 otherwise
    # small integer/bool constants (perm, reps, shape, axes, transpose flags) as read from the package, for the
    # facts derived from them (opfacts); not stored in analyses (the facts are), so not compared
    value: tuple[int, ...] | None = field(default=None, compare=False, repr=False)
    # a Core AI gather's index: what it selects (its values are too many to keep); not stored either
    profile: IndexProfile | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class OpRecord:
    index: int
    type: str
    name: str  # the name of its first output (MIL ops are known by their outputs)
    layer: int | None
    layer_from: str  # "name": the op's or its weights' names say it; "dataflow": its inputs' layers; ""
    inputs: tuple[InputRef, ...]
    outputs: tuple[TensorInfo, ...]
    const_bytes: int  # const ops: stored size of their value
    tile_kind: str | None = None  # copies only (tiles, repeating gathers and concats): "kv_replication" or "other"
    const_zero: bool = False  # const ops: every stored element is 0 (coremltools adds zero biases to linears)
    parent: int | None = None  # the op (cond, while_loop, a Core AI invoke) whose nested block holds this op
    # a Core AI composite's fallback body inlined per call (analyzer.ir.coreai.walk): the composite's declared
    # name ("scaled_dot_product_attention"); None elsewhere
    composite: str | None = None

    @property
    def kind(self) -> str:
        """The MIL op this op moves data like: its own type for a MIL op, the equivalent for a Core AI op
        (``coreai.broadcast_in_dims`` → ``tile``; :mod:`analyzer.ir.coreai.dialect`). The rules key on it."""
        return kind_of(self.type)

    @property
    def output_bytes(self) -> int:
        """Bytes of the outputs that have a size (the byte account lists the others as unsized)."""
        return sum(t.nbytes or 0 for t in self.outputs)


@dataclass(frozen=True, slots=True)
class AssumedShape:
    """The shape an analysis assumed for a flexible input, and why (``analyzer.analysis.shapes``)."""

    name: str
    shape: tuple[int, ...]
    how: str  # "given (--shape)", "query length at its lower bound", "enumerated default", ...

    @property
    def text(self) -> str:
        return f"{self.name} [{','.join(map(str, self.shape))}] ({self.how})"

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "how": self.how}


@dataclass(frozen=True, slots=True)
class MilProgram:
    path: str
    function: str
    opset: str
    spec_version: int
    inputs: tuple[TensorInfo, ...]
    states: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    ops: tuple[OpRecord, ...]
    # a flexible program is analysed at one shape per flexible input: these (its tensors are sized at them)
    assumed_shapes: tuple[AssumedShape, ...] = ()
    # why the program could not be sized at ``assumed_shapes`` (the interpreter's failure, naming the op and the
    # cause); None when it was sized or has static shapes. Its symbolic tensors then keep no size
    # (``analyzer.analysis.sizing`` says what that leaves uncounted)
    sizing_error: str | None = None

    @property
    def total_ops(self) -> int:
        return len(self.ops)

    def op_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(op.type for op in self.ops).items(), key=lambda kv: (-kv[1], kv[0])))

    def tiles(self) -> list[OpRecord]:
        """Ops that copy data into a larger tensor, whatever op makes the copy: MIL ``tile``; Core AI ``tile``,
        ``broadcast_in_dims``, ...; and a ``gather`` or ``concat`` the walk found repeating its input
        (``analyzer.ir.opfacts.copy_steps``: its ``tile_kind`` is set)."""
        return [op for op in self.ops if op.kind == "tile" or op.tile_kind is not None]

    @property
    def backend(self) -> str:
        """``coreai`` for a walked ``.aimodel`` (its opset is ``coreai…``), else ``coreml``."""
        return "coreai" if self.opset.startswith("coreai") else "coreml"

    def consumers(self) -> dict[int, list[int]]:
        return consumer_map(self.ops)


def consumer_map(ops) -> dict[int, list[int]]:
    """Op index → indices of the ops that read one of its outputs."""
    out: dict[int, list[int]] = {op.index: [] for op in ops}
    for op in ops:
        for ref in op.inputs:
            if ref.producer is not None:
                out[ref.producer].append(op.index)
    return out
