"""What a Core AI gather's constant index selects, read in bounded memory and time: the facts that tell a gather
copying K/V heads (coreai-torch's ``index_select``, ``torch.gather``, ``k[:, idx]``) from any other gather.

coreai-torch lowers ``k.index_select(1, idx)`` (``coreai_torch/_aten_to_core.py``, ``replace_index_select``) to::

    %i = constant dense_resource<…> : tensor<1xHqxSxDxsi32>    # idx reshaped to [1, Hq, 1, 1], broadcast to k's shape
    %c = gather_along_axis %k at %i along 1                     # [1, Hkv, S, D] → [1, Hq, S, D]

(``torch.gather`` with an expanded index gives the same op; under dynamic shapes the index stays a
``broadcast_in_dims`` of the ``[1, Hq, 1, 1]`` constant), and ``k[:, idx]`` (``replace_index_tensor``) to
``gather_nd %k at [[[0, h0], [0, h1], …]]``. The index of a gather_along_axis is as large as the copy it makes (a
full-size 70B one, ``[1, 64, 8192, 128]`` int32, is 256 MiB), so it is never held: its **profile along the gather
axis** is recorded (the value at each position of the axis, after checking that the index does not vary along any
other axis), read from the program file's resource blob a piece of :data:`CHUNK_BYTES` at a time
(:mod:`analyzer.ir.coreai.bytecode`). A gather_nd's index has one row per gathered slice (``[1, Hq, 2]``): its rows
are read whole, up to :data:`MAX_ND_VALUES`.

Each reader returns ``{"axis", "values", "why"}`` (JSON-ready, the dump's ``index_profile``): ``values`` None and
``why`` saying what could not be read when the index is computed, too large, varies along another axis, or its
blob cannot be found; the walker then reports the gather as a copy not classified, with that reason.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.ir.coreai.bytecode import BlobIndex, BytecodeError, StoredArray

# A constant the file reader cannot map (a program built in memory, an unreadable file) is copied whole by the
# bindings (``copy_constant_value_to_array`` takes nothing smaller) only up to this size.
MAX_COPY_BYTES = 64 << 20
# A gather_nd index read whole (the head gather of ``k[:, idx]`` has Hq rows of 2 values).
MAX_ND_VALUES = 1 << 16
# An index is checked in pieces of at most this many bytes (min and max per row: no temporary of its size).
CHUNK_BYTES = 16 << 20
_MAX_CHAIN = 8  # ops between the constant and the gather (casts, reshapes, broadcasts)
_RESOURCE = re.compile(r"dense_resource<([\w.$-]+)>")
_INT_TYPES = {"si8": np.int8, "i8": np.int8, "ui8": np.uint8, "si16": np.int16, "i16": np.int16, "ui16": np.uint16,
              "si32": np.int32, "i32": np.int32, "ui32": np.uint32, "si64": np.int64, "i64": np.int64,
              "ui64": np.uint64}
GATHERS = ("coreai.gather_along_axis", "coreai.gather_nd")


class ConstantReader:
    """Integer constants of one program as arrays: inline values from the attribute, resource blobs mapped from
    ``program_file`` (the asset's ``main.mlirb``) when given and readable, else copied up to
    :data:`MAX_COPY_BYTES`. Close it (or use it as a context manager) to unmap the file."""

    def __init__(self, program_file: str | Path | None = None) -> None:
        self.blobs: BlobIndex | None = None
        self.file_why = "the program was not read from a file"
        self.profiles: dict[tuple[str, int], tuple[np.ndarray | None, str]] = {}  # (constant's text, axis): read once
        if program_file is not None:
            try:
                self.blobs = BlobIndex(program_file)
            except (OSError, BytecodeError) as e:
                self.file_why = f"its resource blobs cannot be located ({e})"

    def close(self) -> None:
        if self.blobs is not None:
            self.blobs.close()

    def __enter__(self) -> ConstantReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def array(self, op) -> np.ndarray | StoredArray | str:
        """The value of an integer ``coreai.constant`` (a resource blob: read from the file on demand), or why
        not."""
        from coreai._compiler.ir import DenseIntElementsAttr, RankedTensorType

        t = RankedTensorType(op.results[0].type)
        shape, elem = tuple(int(d) for d in t.shape), str(t.element_type)
        dtype = _INT_TYPES.get(elem)
        if dtype is None:
            return f"its index constant is {elem}, not an integer type qfold reads"
        attr = op.attributes["value"]
        try:
            dense = DenseIntElementsAttr(attr)
        except (ValueError, TypeError):
            dense = None
        if dense is not None:
            return np.full(shape, int(dense[0]), dtype) if dense.is_splat else np.array(dense).reshape(shape)
        m = _RESOURCE.search(str(attr))
        if m is None:
            return "its index constant is neither inline nor a resource blob"
        if self.blobs is not None:
            try:
                return self.blobs.stored(m.group(1), np.dtype(dtype), shape)
            except BytecodeError as e:
                why = str(e)
        else:
            why = self.file_why
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if nbytes > MAX_COPY_BYTES:
            return (f"its index constant ({nbytes:,} bytes) cannot be read from the file ({why}) and is larger than "
                    f"the {MAX_COPY_BYTES:,} bytes qfold copies")
        from coreai._compiler._mlir_libs._coreaiIR._bindings.compiler import copy_constant_value_to_array

        buf = np.zeros(nbytes, np.uint8)
        copy_constant_value_to_array(constant_op=op, destination=buf)
        return buf.view(dtype).reshape(shape)


def gather_profile(op, reader: ConstantReader) -> dict[str, Any]:
    """The index facts of a ``coreai.gather_along_axis`` (its profile along its axis) or ``coreai.gather_nd`` (its
    rows, flattened), as ``{"axis", "values", "why"}``."""
    if op.name == "coreai.gather_nd":
        found = _through_casts(op.operands[1], reader)
        if isinstance(found, str):
            return {"axis": None, "values": None, "why": found}
        if found.size > MAX_ND_VALUES:
            return {"axis": None, "values": None,
                    "why": f"its index has {found.size:,} values, more than the {MAX_ND_VALUES:,} qfold reads"}
        rows = found.read(0, found.size) if isinstance(found, StoredArray) else found.ravel()
        return {"axis": None, "values": [int(v) for v in rows], "why": ""}
    axis = _small_int(op.operands[2])
    rank = _rank(op.operands[0])
    if axis is None or rank is None:
        return {"axis": None, "values": None, "why": "its axis is not a constant (or its input has no rank)"}
    axis %= max(rank, 1)
    values, why = _profile(op.operands[1], axis, reader, 0)
    return {"axis": axis, "values": None if values is None else [int(v) for v in values], "why": why}


def axis_profile(a: np.ndarray | StoredArray, axis: int, chunk_bytes: int = CHUNK_BYTES
                 ) -> tuple[np.ndarray | None, str]:
    """The value at each position of ``axis`` of ``a`` when ``a`` does not vary along any other axis, else why not.
    One pass in row-major order, a piece of at most ``chunk_bytes`` at a time (whole rows of the axis's inner
    extent where they fit, else pieces of one row): the min and max of each row against the row's first value."""
    n = a.shape[axis]
    outer, inner = int(np.prod(a.shape[:axis], dtype=np.int64)), int(np.prod(a.shape[axis + 1:], dtype=np.int64))
    if outer * n * inner == 0:
        return None, "its index is empty"
    if isinstance(a, StoredArray):
        read = a.read
    else:
        flat = np.asarray(a).reshape(-1)

        def read(start: int, count: int) -> np.ndarray:
            return flat[start:start + count]
    values = np.zeros(n, dtype=np.int64)  # filled from the first rows read (outer block 0)
    budget = max(1, chunk_bytes // np.dtype(a.dtype).itemsize)  # elements per piece
    varies = (None, f"its index varies along an axis other than {axis} (not one slice per position)")
    rows = outer * n
    if inner <= budget:
        per = max(1, budget // inner)
        for r0 in range(0, rows, per):
            k = min(per, rows - r0)
            piece = read(r0 * inner, k * inner).reshape(k, inner)
            first = r0 + np.arange(k)
            values[first[first < n]] = piece[first < n, 0]
            expected = values[first % n]
            if not (np.array_equal(piece.min(axis=1), expected) and np.array_equal(piece.max(axis=1), expected)):
                return varies
        return values, ""
    for r in range(rows):
        for j in range(0, inner, budget):
            piece = read(r * inner + j, min(budget, inner - j))
            if r < n and j == 0:
                values[r] = piece[0]
            if piece.min() != values[r % n] or piece.max() != values[r % n]:
                return varies
    return values, ""


# ------------------------------------------------------------------------------------------------ the index's chain
def _profile(value, axis: int, reader: ConstantReader, depth: int) -> tuple[np.ndarray | None, str]:
    """The profile along ``axis`` of ``value``: a constant, or a cast, reshape or broadcast of one (under dynamic
    shapes coreai-torch broadcasts the ``[1, Hq, 1, 1]`` index at run time: only the gather axis need be static)."""
    owner = value.owner
    name = getattr(owner, "name", "")
    if depth > _MAX_CHAIN:
        return None, f"its index is computed through more than {_MAX_CHAIN} ops"
    if name == "coreai.constant":  # K and V (and often every layer) share one index constant: read it once
        key = (str(owner.attributes["value"]) if "dense_resource<" in str(owner.attributes["value"]) else "", axis)
        if key[0] and key in reader.profiles:
            return reader.profiles[key]
        found = reader.array(owner)
        out = (None, found) if isinstance(found, str) else axis_profile(found, axis)
        if key[0]:
            reader.profiles[key] = out
        return out
    if name == "coreai.cast" and _is_int(owner.operands[0]):
        return _profile(owner.operands[0], axis, reader, depth + 1)
    src, out = (_dims(owner.operands[0]), _dims(value)) if name else (None, None)
    if src is None or out is None or out[axis] is None:
        return None, f"its index is computed at run time (by {name or 'an argument'})"
    if name == "coreai.reshape":
        before = _product(out[:axis])
        for b, size in enumerate(src):  # the axis must be one whole axis of the input, at the same place
            if size == out[axis] and before is not None and _product(src[:b]) == before:
                return _profile(owner.operands[0], b, reader, depth + 1)
        return None, f"its index is reshaped so that axis {axis} is not one axis of what it reshapes"
    if name in ("coreai.broadcast_in_dims", "coreai.broadcast_to"):
        b = axis - (len(out) - len(src))  # broadcast_to aligns trailing axes
        if b < 0:
            return None, f"its index is broadcast along axis {axis}"
        values, why = _profile(owner.operands[0], b, reader, depth + 1)
        if values is None or len(values) == out[axis]:
            return values, why
        return (np.repeat(values, out[axis]), "") if len(values) == 1 else (None, "its index broadcast has no size")
    return None, f"its index is computed at run time (by {name})"


def _through_casts(value, reader: ConstantReader) -> np.ndarray | str:
    for _ in range(_MAX_CHAIN):
        owner = value.owner
        name = getattr(owner, "name", "")
        if name == "coreai.constant":
            return reader.array(owner)
        if name != "coreai.cast" or not _is_int(owner.operands[0]):
            return f"its index is computed at run time (by {name or 'an argument'})"
        value = owner.operands[0]
    return f"its index is computed through more than {_MAX_CHAIN} ops"


def _dims(value) -> tuple[int | None, ...] | None:
    """A value's shape, None at a dynamic dimension; None when it has no ranked type."""
    from coreai._compiler.ir import RankedTensorType

    try:
        t = RankedTensorType(value.type)
    except ValueError:
        return None
    return tuple(None if t.is_dynamic_dim(i) else int(t.shape[i]) for i in range(t.rank))


def _product(dims) -> int | None:
    return None if any(d is None for d in dims) else int(np.prod(dims, dtype=np.int64))


def _rank(value) -> int | None:
    from coreai._compiler.ir import RankedTensorType

    try:
        return RankedTensorType(value.type).rank
    except ValueError:
        return None


def _is_int(value) -> bool:
    from coreai._compiler.ir import RankedTensorType

    try:
        return str(RankedTensorType(value.type).element_type) in _INT_TYPES
    except ValueError:
        return False


def _small_int(value) -> int | None:
    """A rank-0 or one-element integer constant's value (a gather's axis)."""
    from coreai._compiler.ir import DenseIntElementsAttr

    owner = value.owner
    if getattr(owner, "name", "") != "coreai.constant":
        return None
    try:
        attr = DenseIntElementsAttr(owner.attributes["value"])
    except (ValueError, TypeError, KeyError):
        return None
    return int(attr[0]) if attr.is_splat or len(attr) == 1 else None
