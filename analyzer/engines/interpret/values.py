"""MIL values as NumPy arrays: dtypes, immediate values from ``Model.proto`` and blobs from ``weight.bin``.

Blob data is memory-mapped (``analyzer.ir.coreml.mil_reader.Blobs.data``): an fp16 weight is a zero-copy view of
the file until an op reads it, so loading a 2.5 GB package reads no weight bytes. Sub-byte data (``uint1..uint6``,
``int4``) is stored packed, least significant bit first (coremltools ``optimize._utils.pack_elements_into_bits``,
the same layout for blobs and for ``bytes`` immediates); it is unpacked to ``uint8`` / ``int8`` on load.
"""

from __future__ import annotations

import math
import os

import numpy as np

from analyzer.errors import InterpretError
from analyzer.ir.coreml.mil_reader import Blobs, TensorInfo

# MIL dtype → the NumPy dtype values of it are held in. Sub-byte integers are widened to one byte.
NP_DTYPES: dict[str, np.dtype] = {
    "fp16": np.dtype(np.float16), "fp32": np.dtype(np.float32), "fp64": np.dtype(np.float64),
    "int8": np.dtype(np.int8), "int16": np.dtype(np.int16), "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8), "uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64), "bool": np.dtype(np.bool_),
    "int4": np.dtype(np.int8), **{f"uint{b}": np.dtype(np.uint8) for b in (1, 2, 3, 4, 6)},
}
SUB_BYTE_BITS = {"int4": 4, "uint1": 1, "uint2": 2, "uint3": 3, "uint4": 4, "uint6": 6}

# ``cast``/``constexpr_cast`` name their target with these strings (coremltools types.string_to_builtin).
CAST_NAMES = {"fp16": "fp16", "fp32": "fp32", "fp64": "fp64", "int8": "int8", "uint8": "uint8", "int16": "int16",
              "uint16": "uint16", "int32": "int32", "uint32": "uint32", "int64": "int64", "bool": "bool"}


# The largest array the interpreter makes from a declared shape (states, inputs it fills, op results, constants):
# a full-size 7-8B decode step's KV state at ctx 32768 is 4 GiB. Declared shapes of 2**40 elements (TiB-PiB) are
# refused here, before NumPy tries. ``QFOLD_MAX_ARRAY_BYTES`` sets it (inspect and diff allocate nothing and
# have no such ceiling).
DEFAULT_MAX_ARRAY_BYTES = 8 << 30
MAX_ARRAY_BYTES_ENV = "QFOLD_MAX_ARRAY_BYTES"


def max_array_bytes() -> int:
    text = os.environ.get(MAX_ARRAY_BYTES_ENV, "")
    return int(text) if text.isdigit() and len(text) < 20 else DEFAULT_MAX_ARRAY_BYTES


def check_array_size(shape: tuple, dtype: str, what: str) -> int:
    """The element count of a declared shape, refused (naming ``what``) when a dimension is negative or the array
    would take more than :func:`max_array_bytes`. Symbolic (None) dimensions are not checked here."""
    if any(d is None for d in shape):
        return -1
    if any(int(d) < 0 for d in shape):
        raise InterpretError(f"{what}: declared shape {list(shape)} has a negative dimension")
    count = math.prod(int(d) for d in shape)
    itemsize = NP_DTYPES[dtype].itemsize if dtype in NP_DTYPES else 1
    cap = max_array_bytes()
    if count * itemsize > cap:
        raise InterpretError(f"{what}: declared shape {list(shape)} ({dtype}) would take {count * itemsize:,} bytes, "
                             f"more than the {cap:,} an interpreter array may take (${MAX_ARRAY_BYTES_ENV})")
    return count


def np_dtype(mil_dtype: str) -> np.dtype:
    try:
        return NP_DTYPES[mil_dtype]
    except KeyError:
        raise InterpretError(f"MIL dtype {mil_dtype!r} is not supported by the interpreter "
                             f"(supported: {', '.join(NP_DTYPES)})") from None


def unpack_bits(packed: np.ndarray, nbits: int, count: int, signed: bool) -> np.ndarray:
    """``count`` ``nbits``-bit integers packed LSB first into bytes → ``uint8`` (or ``int8`` if ``signed``)."""
    packed = np.ascontiguousarray(packed, dtype=np.uint8).reshape(-1)
    if packed.size * 8 < count * nbits:
        raise InterpretError(f"{packed.size} packed bytes cannot hold {count} {nbits}-bit values")
    if 8 % nbits == 0:  # 1, 2, 4 bits: whole values per byte, shift out each lane
        shifts = np.arange(0, 8, nbits, dtype=np.uint8)
        out = ((packed[:, None] >> shifts) & np.uint8((1 << nbits) - 1)).reshape(-1)[:count]
    else:  # 3, 6 bits: values straddle bytes
        bits = np.unpackbits(packed, bitorder="little")[: count * nbits].reshape(count, nbits)
        out = (bits.astype(np.uint8) << np.arange(nbits, dtype=np.uint8)).sum(axis=1, dtype=np.uint8)
    if signed:
        out = out.astype(np.int16)
        out[out >= 1 << (nbits - 1)] -= 1 << nbits
        return out.astype(np.int8)
    return out


def _from_bytes(raw, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    count = math.prod(shape)  # Python ints: np.prod in int64 wraps for 2**40 x 2**40
    if dtype in SUB_BYTE_BITS:
        arr = np.frombuffer(raw, np.uint8) if isinstance(raw, bytes) else raw
        return unpack_bits(arr, SUB_BYTE_BITS[dtype], count, signed=dtype == "int4").reshape(shape)
    npd = np_dtype(dtype)
    arr = np.frombuffer(raw, np.uint8) if isinstance(raw, bytes) else raw
    if arr.size != count * npd.itemsize:
        raise InterpretError(f"stored {arr.size} bytes for a {dtype} tensor of shape {list(shape)} "
                             f"({count * npd.itemsize} expected)")
    return arr.view(npd).reshape(shape)


def decode_value(value, info: TensorInfo, blobs: Blobs) -> np.ndarray | str:
    """A proto ``MIL_pb2.Value`` (immediate or blob) as an array of ``info``'s dtype and shape (a ``str`` for a
    string scalar). Blob data comes back as a read-only memory-mapped view."""
    if any(d is None for d in info.shape):
        raise InterpretError(f"constant {info.name!r} has a symbolic shape {info.shape_text}")
    shape = tuple(int(d) for d in info.shape)  # type: ignore[arg-type]
    count = check_array_size(shape, info.dtype, f"constant {info.name!r}")
    kind = value.WhichOneof("value")
    if kind == "blobFileValue":
        raw = blobs.data(value.blobFileValue.fileName, value.blobFileValue.offset)
        return _from_bytes(raw, info.dtype, shape)
    if kind != "immediateValue":
        raise InterpretError(f"constant {info.name!r}: unsupported value kind {kind!r}")
    imm = value.immediateValue
    if imm.WhichOneof("value") != "tensor":
        raise InterpretError(f"constant {info.name!r}: unsupported immediate {imm.WhichOneof('value')!r}")
    tensor = imm.tensor
    field = tensor.WhichOneof("value")
    if info.dtype == "string":
        strings = [s.decode() if isinstance(s, bytes) else s for s in tensor.strings.values]
        return strings[0] if shape == () else np.array(strings).reshape(shape)
    if field == "bytes":
        return _from_bytes(tensor.bytes.values, info.dtype, shape).copy()
    stored = 0 if field is None else len(getattr(tensor, field).values)
    if stored != count:
        raise InterpretError(f"constant {info.name!r}: {stored:,} values stored for declared shape {list(shape)} "
                             f"({count:,} elements)")
    values = [] if field is None else list(getattr(tensor, field).values)
    return np.array(values, dtype=np_dtype(info.dtype)).reshape(shape)
