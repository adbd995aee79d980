"""Walk a saved ML Program ``.mlpackage`` straight from its protobuf: one typed record per op.

Reading ``Model.proto`` (the MIL program) plus the 64-byte headers of the blobs in ``weight.bin`` takes
~0.2 s and ~0.4 GB even for a 2.5 GB package (design.md), needs no Core ML runtime, and works on any
ML Program package, including ones other tools built. (``MLModel(...)._mil_program`` is None for a loaded
file, and ``milproto.load`` takes ~9 s and ~5 GB and re-fuses state writes.)

Shapes are logical MIL tensor shapes; ``nbytes`` is elements × dtype bits / 8 rounded up. Constant data is
sized from what is stored: the blob header's byte count for ``weight.bin`` data, the value's own size for
immediates.
"""

from __future__ import annotations

import re
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from analyzer.errors import MilError

# Bits per element of MIL dtypes (proto enum names, lower-cased without the FLOAT/INT spelling).
DTYPE_BITS: dict[str, int] = {
    "fp16": 16, "fp32": 32, "fp64": 64, "bf16": 16, "fp8e4m3fn": 8, "fp8e5m2": 8,
    "int1": 1, "int2": 2, "int3": 3, "int4": 4, "int6": 6, "int8": 8, "int16": 16, "int32": 32, "int64": 64,
    "uint1": 1, "uint2": 2, "uint3": 3, "uint4": 4, "uint6": 6, "uint8": 8, "uint16": 16, "uint32": 32,
    "uint64": 64, "bool": 8,
}
_PROTO_DTYPE = {
    "FLOAT16": "fp16", "FLOAT32": "fp32", "FLOAT64": "fp64", "BFLOAT16": "bf16", "FLOAT8E4M3FN": "fp8e4m3fn",
    "FLOAT8E5M2": "fp8e5m2", "BOOL": "bool", "STRING": "string",
    **{f"{s}INT{b}": f"{s.lower()}int{b}" for s in ("", "U") for b in (1, 2, 3, 4, 6, 8, 16, 32, 64)},
}
# Vectors (rank ≤ 1) up to 4 MiB are read to see whether they are all zeros: coremltools gives every bias-free
# linear a zero bias, up to vocabulary size for an lm_head (262,144 fp16 values = 512 KiB for Gemma 3).
ZERO_CHECK_MAX_BYTES = 4 << 20
_BLOB_SENTINEL = 0xDEADBEEF  # coremltools MIL blob storage v2: header = sentinel, dtype, size, offset

# Ops that only re-label a tensor: in Core ML they move no data (design.md, byte accounting).
VIEW_OPS = frozenset({"reshape", "expand_dims", "squeeze", "identity"})

# Where a name reveals a decoder layer: "model_layers_12_self_attn_...", "layers.3.", "k_cache_7", "h_4_".
_LAYER_PATTERNS = (
    re.compile(r"(?:^|[_.])layers?[_.](\d+)(?:[_.]|$)"),
    re.compile(r"(?:^|[_.])(?:h|blocks?)[_.](\d+)(?:[_.]|$)"),
    re.compile(r"(?:^|_)[kv]_cache_(\d+)$"),
)
# Weights of the parts outside the decoder layers: embedding, final norm, lm_head.
_OUTSIDE_LAYERS = re.compile(r"lm_head|embed_tokens|(?:^|_)wte(?:_|$)|(?:^|_)norm_weight|final_norm|(?:^|_)ln_f(?:_|$)")


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int | None, ...]  # None marks a symbolic dimension
    dtype: str  # "fp16", "int32", "uint4", ... ("string", "list", ... for non-tensors)
    nbytes: int | None  # logical size; None when a dimension is symbolic or the dtype has no size

    @property
    def shape_text(self) -> str:
        return "[" + ",".join("?" if d is None else str(d) for d in self.shape) + "]"


@dataclass(frozen=True, slots=True)
class InputRef:
    param: str  # the op's input parameter ("x", "weight", "reps", ...)
    tensor: TensorInfo
    producer: int | None  # index of the op that produces it; None for program inputs/states and immediates
    is_const: bool  # produced by a const op or given inline as a value
    stored_bytes: int  # for constants, the bytes as stored (blob size or immediate); 0 otherwise


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
    tile_kind: str | None = None  # tiles only: "kv_replication" or "other"
    const_zero: bool = False  # const ops: every stored element is 0 (coremltools adds zero biases to linears)

    @property
    def output_bytes(self) -> int:
        return sum(t.nbytes or 0 for t in self.outputs)


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

    @property
    def total_ops(self) -> int:
        return len(self.ops)

    def op_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(op.type for op in self.ops).items(), key=lambda kv: (-kv[1], kv[0])))

    def tiles(self) -> list[OpRecord]:
        return [op for op in self.ops if op.type == "tile"]

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


# ------------------------------------------------------------------------------------------------- proto
def _dtype_name(enum_value: int) -> str:
    from coremltools.proto import MIL_pb2

    name = MIL_pb2.DataType.Name(enum_value)
    return _PROTO_DTYPE.get(name, name.lower())


def _nbytes(shape: tuple[int | None, ...], dtype: str) -> int | None:
    bits = DTYPE_BITS.get(dtype)
    if bits is None or any(d is None for d in shape):
        return None
    n = 1
    for d in shape:
        n *= d  # type: ignore[operator]
    return (n * bits + 7) // 8


def tensor_info(name: str, value_type) -> TensorInfo:
    which = value_type.WhichOneof("type")
    if which == "stateType":
        return tensor_info(name, value_type.stateType.wrappedType)
    if which != "tensorType":
        return TensorInfo(name, (), which or "unknown", None)
    tt = value_type.tensorType
    shape = tuple(d.constant.size if d.WhichOneof("dimension") == "constant" else None for d in tt.dimensions)
    dtype = _dtype_name(tt.dataType)
    return TensorInfo(name, shape, dtype, _nbytes(shape, dtype))


class Blobs:
    """Reads blob sizes from ``weight.bin`` headers; one open file per blob file."""

    def __init__(self, weights_dir: Path):
        self.weights_dir = weights_dir
        self._files: dict[str, object] = {}
        self._maps: dict[str, object] = {}

    def size(self, file_name: str, offset: int) -> int:
        return self._header(file_name, offset)[0]

    def is_zero(self, file_name: str, offset: int, limit: int = ZERO_CHECK_MAX_BYTES) -> bool:
        """Whether a (small) blob holds only zero bytes; blobs over ``limit`` are not read."""
        size, data_offset, f = self._header(file_name, offset)
        if size > limit:
            return False
        f.seek(data_offset)  # type: ignore[attr-defined]
        return not any(f.read(size))  # type: ignore[attr-defined]

    def data(self, file_name: str, offset: int):
        """The stored bytes of one blob as a read-only, memory-mapped ``uint8`` array (nothing is read until
        it is used; the mapping stays valid after ``close``)."""
        import numpy as np

        size, data_offset, _ = self._header(file_name, offset)
        rel = file_name.removeprefix("@model_path/weights/")
        mm = self._maps.get(rel)
        if mm is None:
            mm = self._maps[rel] = np.memmap(self._path(file_name), dtype=np.uint8, mode="r")
        if data_offset + size > len(mm):  # type: ignore[arg-type]
            raise MilError(f"{self._path(file_name)}: blob at offset {offset} runs past the end of the file")
        return mm[data_offset:data_offset + size]  # type: ignore[index]

    def _path(self, file_name: str) -> Path:
        rel = file_name.removeprefix("@model_path/weights/")
        path = (self.weights_dir / rel).resolve()
        if self.weights_dir.resolve() not in path.parents:
            raise MilError(f"blob file {file_name!r} points outside the package")
        return path

    def _header(self, file_name: str, offset: int):
        rel = file_name.removeprefix("@model_path/weights/")
        path = self._path(file_name)
        f = self._files.get(rel)
        if f is None:
            try:
                f = self._files[rel] = path.open("rb")
            except OSError as e:
                raise MilError(f"cannot open weight file {path}: {e}") from e
        f.seek(offset)  # type: ignore[attr-defined]
        head = f.read(24)  # type: ignore[attr-defined]
        if len(head) < 24:
            raise MilError(f"{path}: truncated blob header at offset {offset}")
        sentinel, _dtype, size, data_offset = struct.unpack("<IIQQ", head)
        if sentinel != _BLOB_SENTINEL:
            raise MilError(f"{path}: no blob header at offset {offset} (found 0x{sentinel:08X})")
        return size, data_offset, f

    def close(self) -> None:
        for f in self._files.values():
            f.close()  # type: ignore[attr-defined]


def _value_stored_bytes(value, info: TensorInfo, blobs: Blobs) -> int:
    kind = value.WhichOneof("value")
    if kind == "blobFileValue":
        return blobs.size(value.blobFileValue.fileName, value.blobFileValue.offset)
    if info.dtype == "string":
        return sum(len(s) for s in value.immediateValue.tensor.strings.values)
    return info.nbytes or 0


def _value_is_zero(value, blobs: Blobs) -> bool:
    kind = value.WhichOneof("value")
    if kind == "blobFileValue":
        return blobs.is_zero(value.blobFileValue.fileName, value.blobFileValue.offset)
    if kind != "immediateValue" or value.immediateValue.WhichOneof("value") != "tensor":
        return False
    tensor = value.immediateValue.tensor
    which = tensor.WhichOneof("value")
    if which is None:
        return False
    values = getattr(tensor, which).values
    return len(values) > 0 and not any(values)


def layer_from_name(name: str) -> int | None:
    for pat in _LAYER_PATTERNS:
        m = pat.search(name)
        if m:
            return int(m.group(1))
    return None


def find_package(path: str | Path) -> Path:
    """A build folder (holding one ``.mlpackage``) or a ``.mlpackage`` itself."""
    p = Path(path)
    if p.suffix == ".mlpackage" and p.is_dir():
        return p
    if p.is_dir():
        found = sorted(p.glob("*.mlpackage"))
        if len(found) == 1:
            return found[0]
        if found:
            raise MilError(f"{p}: holds {len(found)} .mlpackage folders; name one")
    raise MilError(f"{p}: not an .mlpackage nor a build folder holding one")


@dataclass(frozen=True)
class LoadedFunction:
    """One function of a package's ``Model.proto``, ready to walk or evaluate."""

    package: Path
    spec: object  # coremltools.proto.Model_pb2.Model
    name: str
    function: object  # MIL_pb2.Function
    block: object  # MIL_pb2.Block of the function's opset

    @property
    def weights_dir(self) -> Path:
        return self.package / "Data" / "com.apple.CoreML" / "weights"


def load_function(path: str | Path, function: str | None = None) -> LoadedFunction:
    """Read ``Model.proto`` of a package (or build folder) and pick a function: ``function``, else ``main``,
    else the first. Raises ``MilError`` for anything that is not a readable ML Program."""
    from coremltools.models.utils import load_spec

    pkg = find_package(path)
    try:
        spec = load_spec(str(pkg))
    except Exception as e:  # coremltools raises bare Exceptions for unreadable packages
        raise MilError(f"{pkg}: cannot read Model.proto: {e}") from e
    if spec.WhichOneof("Type") != "mlProgram":
        raise MilError(f"{pkg}: a {spec.WhichOneof('Type')} model, not an ML Program; qfold walks MIL programs")
    funcs = spec.mlProgram.functions
    if not funcs:
        raise MilError(f"{pkg}: the ML Program has no functions")
    fn = function or ("main" if "main" in funcs else next(iter(funcs)))
    if fn not in funcs:
        raise MilError(f"{pkg}: no function {fn!r} (has {', '.join(funcs)})")
    func = funcs[fn]
    if func.opset not in func.block_specializations:
        raise MilError(f"{pkg}: function {fn!r} has no block for its opset {func.opset!r}")
    return LoadedFunction(pkg, spec, fn, func, func.block_specializations[func.opset])


def read_program(path: str | Path, function: str | None = None) -> MilProgram:
    """Parse a saved ML Program package into op records (with tile classification)."""
    loaded = load_function(path, function)
    pkg, spec, fn, func = loaded.package, loaded.spec, loaded.name, loaded.function
    blobs = Blobs(loaded.weights_dir)
    try:
        ops = _walk(loaded.block, blobs, {i.name: tensor_info(i.name, i.type) for i in func.inputs})
    finally:
        blobs.close()
    ops = _classify_tiles(_propagate_layers(ops))
    desc = spec.description
    states = tuple(TensorInfo(s.name, *_feature_shape(s)) for s in desc.state)
    state_names = {s.name for s in states}
    inputs = tuple(tensor_info(i.name, i.type) for i in func.inputs if i.name not in state_names)
    outputs = tuple(TensorInfo(o.name, *_feature_shape(o)) for o in desc.output)
    return MilProgram(str(pkg), fn, func.opset, spec.specificationVersion, inputs, states, outputs, tuple(ops))


def _feature_shape(feature) -> tuple[tuple[int | None, ...], str, int | None]:
    """Shape/dtype of a model-description feature (an output or a state wrapping a multi-array)."""
    ft = feature.type
    arr = ft.stateType.arrayType if ft.WhichOneof("Type") == "stateType" else ft.multiArrayType
    from coremltools.proto import FeatureTypes_pb2

    shape = tuple(int(d) for d in arr.shape)
    enum_name = FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(arr.dataType)  # "FLOAT16", "INT32", ...
    dtype = {"DOUBLE": "fp64"}.get(enum_name, _PROTO_DTYPE.get(enum_name, enum_name.lower()))
    return shape, dtype, _nbytes(shape, dtype)


def _walk(block, blobs: Blobs, program_inputs: dict[str, TensorInfo]) -> list[OpRecord]:
    records: list[OpRecord] = []
    producer: dict[str, int] = {}
    is_const: dict[str, bool] = {}
    stored: dict[str, int] = {}
    infos: dict[str, TensorInfo] = dict(program_inputs)

    def visit(blk) -> None:
        for op in blk.operations:
            index = len(records)
            outputs = tuple(tensor_info(o.name, o.type) for o in op.outputs)
            const_bytes, const_zero = 0, False
            if op.type == "const":
                const_bytes = _value_stored_bytes(op.attributes["val"], outputs[0], blobs)
                const_zero = (outputs[0].dtype != "string" and len(outputs[0].shape) <= 1
                              and _value_is_zero(op.attributes["val"], blobs))
            refs = []
            for param, arg in op.inputs.items():
                for binding in arg.arguments:
                    if binding.WhichOneof("binding") == "name":
                        name = binding.name
                        info = infos.get(name) or TensorInfo(name, (), "unknown", None)
                        refs.append(InputRef(param, info, producer.get(name), is_const.get(name, False),
                                             stored.get(name, 0)))
                    else:  # an inline value (iOS18 constexpr ops carry their data this way)
                        info = tensor_info(f"{op.outputs[0].name}.{param}" if op.outputs else param,
                                            binding.value.type)
                        refs.append(InputRef(param, info, None, True,
                                             _value_stored_bytes(binding.value, info, blobs)))
            name = op.outputs[0].name if op.outputs else f"{op.type}_{index}"
            records.append(OpRecord(index, op.type, name, None, "", tuple(refs), outputs, const_bytes,
                                    const_zero=const_zero))
            for o in outputs:
                producer[o.name] = index
                infos[o.name] = o
                is_const[o.name] = op.type == "const"
                stored[o.name] = const_bytes
            for b in op.blocks:
                visit(b)

    visit(block)
    return records


def _propagate_layers(ops: list[OpRecord]) -> list[OpRecord]:
    """Layer of each op: from its own name, else its constants' names, else the latest layer among the
    ops (or program inputs/states) it reads. Constants named for a part outside the decoder layers
    (embedding, final norm, lm_head) mark an op as outside (``None``). Ops are in topological order,
    so one pass suffices."""
    out: list[OpRecord] = []
    for op in ops:
        layer, how = layer_from_name(op.name), "name"
        if layer is None:
            const_names = [r.tensor.name for r in op.inputs if r.is_const]
            const_layers = [x for x in map(layer_from_name, const_names) if x is not None]
            if const_layers:
                layer = max(const_layers)
            elif any(_OUTSIDE_LAYERS.search(n) for n in const_names):
                out.append(_replace(op, layer=None, layer_from="name"))
                continue
        if layer is None:
            how = "dataflow"
            seen = []
            for r in op.inputs:
                if r.is_const:
                    continue
                if r.producer is not None:
                    seen.append(out[r.producer].layer)
                else:
                    seen.append(layer_from_name(r.tensor.name))
            seen = [x for x in seen if x is not None]
            layer = max(seen) if seen else None
        out.append(_replace(op, layer=layer, layer_from=how if layer is not None else ""))
    return out


def _replace(op: OpRecord, **changes) -> OpRecord:
    from dataclasses import replace

    return replace(op, **changes)


# What reads a replicated K/V: the score and output matmuls, and with a read-only cache the product of the
# current token's weight with its own replicated value (``w[..., S:] * v_new``).
_ATTENTION_CONSUMERS = frozenset({"matmul", "mul", "einsum"})
# Ops a replicated K/V may pass through on its way to the attention matmul without being used.
_PASS_THROUGH = VIEW_OPS | {"transpose", "cast"}


def _classify_tiles(ops: list[OpRecord]) -> list[OpRecord]:
    """A tile is ``kv_replication`` when its output reaches attention (a ``matmul``, or the ``mul`` of the
    read-only-cache self term) through views only: the repeat_kv pattern ``expand_dims → tile → reshape →
    matmul``. Any other tile (coremltools' own passes can emit some) is ``other``."""
    consumers = consumer_map(ops)

    def reaches_matmul(index: int, depth: int = 0) -> bool:
        if depth > 8:
            return False
        for c in consumers[index]:
            t = ops[c].type
            if t in _ATTENTION_CONSUMERS or (t in _PASS_THROUGH and reaches_matmul(c, depth + 1)):
                return True
        return False

    return [
        _replace(op, tile_kind="kv_replication" if reaches_matmul(op.index) else "other") if op.type == "tile" else op
        for op in ops
    ]
