"""From the ML Program protobuf to op records: tensor types, stored constant sizes, nested blocks.

Constant data is sized from what is stored: the blob header's byte count for ``weight.bin`` data (coremltools'
blob storage v2: a 64-byte header per blob, the first 24 bytes being sentinel, dtype, size, offset), the
value's own size for immediates. Nothing here reads weight values, except vectors small enough to check for
all zeros.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import struct
import sys
from collections import ChainMap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from analyzer.errors import MilError
from analyzer.fsio import open_regular, resolved
from analyzer.ir.mil_records import InputRef, OpRecord, TensorInfo, tensor_nbytes

_PROTO_DTYPE = {
    "FLOAT16": "fp16", "FLOAT32": "fp32", "FLOAT64": "fp64", "BFLOAT16": "bf16", "FLOAT8E4M3FN": "fp8e4m3fn",
    "FLOAT8E5M2": "fp8e5m2", "BOOL": "bool", "STRING": "string",
    **{f"{s}INT{b}": f"{s.lower()}int{b}" for s in ("", "U") for b in (1, 2, 3, 4, 6, 8, 16, 32, 64)},
}
# Vectors (rank ≤ 1) up to 4 MiB are read to see whether they are all zeros: coremltools gives every bias-free
# linear a zero bias, up to vocabulary size for an lm_head (262,144 fp16 values = 512 KiB for Gemma 3).
ZERO_CHECK_MAX_BYTES = 4 << 20
_BLOB_SENTINEL = 0xDEADBEEF  # coremltools MIL blob storage v2 (mil/backend/mil/helper.py, BlobWriter)
_BLOB_HEADER = struct.Struct("<IIQQ")  # sentinel, dtype, size in bytes, offset of the data
_WEIGHTS_PARTS = ("Data", "com.apple.CoreML", "weights")


# coremltools' generated protobuf modules (coremltools/proto/*_pb2.py) import only protobuf and each other
# (relatively), but ``import coremltools.proto.X`` runs ``coremltools/__init__.py`` first, which imports its
# converters and torch: ~4-6 s of CPU for a process that only reads a package (inspect, diff, run, the dashboard).
# So a process that has not imported coremltools loads the same files as a package of another name; protobuf
# registers each .proto file once (an identical second registration is the same file), so the message classes are
# coremltools' own classes whichever way they were loaded.
_PROTO_ALIAS = "qfold_coremltools_proto"


@functools.cache  # called per tensor of a walk
def coreml_proto(name: str) -> ModuleType:
    """coremltools' generated protobuf module ``name`` (``"Model_pb2"``, ``"MIL_pb2"``, ...), without importing
    coremltools itself when it is not imported yet."""
    if "coremltools" in sys.modules:
        return importlib.import_module(f"coremltools.proto.{name}")
    if _PROTO_ALIAS not in sys.modules:
        found = importlib.util.find_spec("coremltools")
        if found is None or found.origin is None:
            raise ModuleNotFoundError("No module named 'coremltools'", name="coremltools")
        folder = Path(found.origin).parent / "proto"
        spec = importlib.util.spec_from_file_location(_PROTO_ALIAS, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[_PROTO_ALIAS] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[_PROTO_ALIAS]
            raise
    return importlib.import_module(f"{_PROTO_ALIAS}.{name}")


def dtype_name(enum_value: int, where: str = "a tensor") -> str:
    """The MIL dtype of a ``DataType`` enum value; a value the enum does not define is a ``MilError`` naming
    ``where`` (protobuf keeps unknown enum values as plain ints)."""
    try:
        name = coreml_proto("MIL_pb2").DataType.Name(enum_value)
    except ValueError:
        raise MilError(f"{where}: unknown dataType enum value {enum_value}") from None
    return _PROTO_DTYPE.get(name, name.lower())


def tensor_info(name: str, value_type) -> TensorInfo:
    """A MIL ValueType as a TensorInfo; a dimension that is not a constant (flexible shapes) is None."""
    which = value_type.WhichOneof("type")
    if which == "stateType":
        return tensor_info(name, value_type.stateType.wrappedType)
    if which != "tensorType":
        return TensorInfo(name, (), which or "unknown", None)
    tt = value_type.tensorType
    shape = tuple(d.constant.size if d.WhichOneof("dimension") == "constant" else None for d in tt.dimensions)
    dtype = dtype_name(tt.dataType, f"tensor {name!r}")
    return TensorInfo(name, shape, dtype, tensor_nbytes(shape, dtype))


def feature_info(feature) -> TensorInfo:
    """An output or state of the model description (a multi-array, possibly wrapped as a state)."""
    ft = feature.type
    arr = ft.stateType.arrayType if ft.WhichOneof("Type") == "stateType" else ft.multiArrayType
    shape = tuple(int(d) for d in arr.shape)
    try:
        array_types = coreml_proto("FeatureTypes_pb2").ArrayFeatureType.ArrayDataType
        enum_name = array_types.Name(arr.dataType)  # "FLOAT16", "INT32", ...
    except ValueError:
        raise MilError(f"feature {feature.name!r} of the model description: unknown dataType enum value "
                       f"{arr.dataType}") from None
    dtype = {"DOUBLE": "fp64"}.get(enum_name, _PROTO_DTYPE.get(enum_name, enum_name.lower()))
    return TensorInfo(feature.name, shape, dtype, tensor_nbytes(shape, dtype))


class Blobs:
    """Reads blob sizes from ``weight.bin`` headers; one open file per blob file."""

    def __init__(self, weights_dir: Path):
        self.weights_dir = weights_dir
        # where blob files may be: the package's own weights folder, a link out of it is outside
        pkg = weights_dir.parents[2] if weights_dir.parts[-3:] == _WEIGHTS_PARTS else weights_dir
        self._base = resolved(pkg, MilError).joinpath(*weights_dir.parts[len(pkg.parts):])
        self._files: dict[str, object] = {}
        self._sizes: dict[str, int] = {}
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
        path = resolved(self.weights_dir / rel, MilError)
        if self._base not in path.parents:
            raise MilError(f"blob file {file_name!r} points outside the package")
        return path

    def _header(self, file_name: str, offset: int):
        """(data size, data offset, open file) of the blob whose header is at ``offset``; both checked against
        the file's real size before anything is read or mapped."""
        rel = file_name.removeprefix("@model_path/weights/")
        path = self._path(file_name)
        f = self._files.get(rel)
        if f is None:
            fd = open_regular(path, MilError)  # a FIFO or device would hang or stream forever
            f = self._files[rel] = os.fdopen(fd, "rb")
            self._sizes[rel] = os.fstat(fd).st_size
        file_size = self._sizes[rel]
        if not 0 <= offset <= file_size - _BLOB_HEADER.size:
            raise MilError(f"{path}: truncated blob header at offset {offset} (the file has {file_size:,} bytes)")
        f.seek(offset)  # type: ignore[attr-defined]
        head = f.read(_BLOB_HEADER.size)  # type: ignore[attr-defined]
        if len(head) < _BLOB_HEADER.size:
            raise MilError(f"{path}: truncated blob header at offset {offset}")
        sentinel, _dtype, size, data_offset = _BLOB_HEADER.unpack(head)
        if sentinel != _BLOB_SENTINEL:
            raise MilError(f"{path}: no blob header at offset {offset} (found 0x{sentinel:08X})")
        if data_offset + size > file_size:
            raise MilError(f"{path}: blob at offset {offset} declares {size:,} bytes at {data_offset:,}, past the "
                           f"end of the file ({file_size:,} bytes)")
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


# Integer and bool constants up to this many elements keep their values on the records (perm, reps, shape, axes,
# transpose flags: what the replication facts are derived from).
SMALL_VALUE_MAX = 64


def small_value(value, info: TensorInfo) -> tuple[int, ...] | None:
    """An immediate integer or bool constant of at most :data:`SMALL_VALUE_MAX` elements as a tuple of ints."""
    if value.WhichOneof("value") != "immediateValue" or value.immediateValue.WhichOneof("value") != "tensor":
        return None
    tensor = value.immediateValue.tensor
    which = tensor.WhichOneof("value")
    if which not in ("ints", "longInts", "bools"):
        return None
    values = getattr(tensor, which).values
    return tuple(int(v) for v in values) if len(values) <= SMALL_VALUE_MAX else None


@dataclass(frozen=True, slots=True)
class _Binding:
    """What a name in scope refers to."""

    info: TensorInfo
    producer: int | None
    is_const: bool
    stored_bytes: int
    value: tuple[int, ...] | None = None


def walk_block(block, blobs: Blobs, function_inputs: dict[str, TensorInfo]) -> list[OpRecord]:
    """Every op of a function's block and, depth first, of the blocks nested in its ops (``cond``'s two
    branches, ``while_loop``'s condition and body), in topological order. Each nested block has its own
    scope: it sees the names of the blocks around it and its own inputs (a loop's variables), and the
    names it defines end with it; only the op that holds it is visible afterwards."""
    records: list[OpRecord] = []

    def bind(info: TensorInfo) -> _Binding:
        return _Binding(info, None, False, 0)

    def visit(blk, scope: ChainMap, parent: int | None) -> None:
        for op in blk.operations:
            index = len(records)
            outputs = tuple(tensor_info(o.name, o.type) for o in op.outputs)
            const_bytes, const_zero, value = 0, False, None
            if op.type == "const":
                value = small_value(op.attributes["val"], outputs[0])
                const_bytes = _value_stored_bytes(op.attributes["val"], outputs[0], blobs)
                const_zero = (outputs[0].dtype != "string" and len(outputs[0].shape) <= 1
                              and _value_is_zero(op.attributes["val"], blobs))
            refs = []
            for param, arg in op.inputs.items():
                for binding in arg.arguments:
                    if binding.WhichOneof("binding") == "name":
                        name = binding.name
                        b = scope.get(name) or bind(TensorInfo(name, (), "unknown", None))
                        refs.append(InputRef(param, b.info, b.producer, b.is_const, b.stored_bytes, b.value))
                    else:  # an inline value (iOS18 constexpr ops carry their data this way)
                        info = tensor_info(f"{op.outputs[0].name}.{param}" if op.outputs else param,
                                           binding.value.type)
                        refs.append(InputRef(param, info, None, True, _value_stored_bytes(binding.value, info, blobs),
                                             small_value(binding.value, info)))
            name = op.outputs[0].name if op.outputs else f"{op.type}_{index}"
            records.append(OpRecord(index, op.type, name, None, "", tuple(refs), outputs, const_bytes,
                                    const_zero=const_zero, parent=parent))
            for b in op.blocks:
                visit(b, scope.new_child({i.name: bind(tensor_info(i.name, i.type)) for i in b.inputs}), index)
            for o in outputs:
                scope[o.name] = _Binding(o, index, op.type == "const", const_bytes, value)

    visit(block, ChainMap({n: bind(i) for n, i in function_inputs.items()}), None)
    return records
