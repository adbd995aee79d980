"""Where each resource blob of an MLIR bytecode file lies, so a large constant is read in place, never copied.

A Core AI asset's program (``main.mlirb``) is MLIR bytecode; a constant too large to print inline is a
``dense_resource<NAME>`` whose bytes are a blob in the file's resource section. The bindings coreai-core ships copy
such a value only whole, into a buffer of its full size (``copy_constant_value_to_array``); a full-size 70B
index constant of coreai-torch's ``index_select`` (``[1, 64, 8192, 128]`` int32) is 256 MiB. This reader finds the
blob's offset and size from the file's section table instead, so the caller reads it piece by piece
(:meth:`BlobIndex.stored`: a :class:`StoredArray` read with ``os.pread``, a bounded buffer at a time).

The format is MLIR's (mlir/docs/BytecodeFormat.md, llvm-project): ``"MLïR"``, a version varint, a producer string,
then sections ``{id | aligned << 7: byte, length: varint, [alignment: varint, padding 0xCB…], data}``. The string
section (id 0) is ``numStrings``, the lengths in reverse order, then the strings' bytes. The resource offset
section (id 6) is ``numExternalResourceGroups``, that many ``{key, numResources, resources}`` groups, then one
``{dialect, numResources, resources}`` group per dialect until its end; each resource is ``{key: string index,
size: varint, kind: byte}`` and its entry is the next ``size`` bytes of the resource section (id 5); a blob entry
(kind 0) is ``{alignment: varint, size: varint, padding, bytes}``, aligned from the start of the file.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np

MAGIC = b"ML\xefR"
_STRINGS, _RESOURCES, _RESOURCE_OFFSETS = 0, 5, 6
_BLOB = 0  # AsmResourceEntryKind::Blob


class BytecodeError(ValueError):
    """The file is not MLIR bytecode this reader understands (why in the message)."""


class _Reader:
    def __init__(self, buf, start: int = 0, end: int | None = None) -> None:
        self.buf, self.pos, self.end = buf, start, len(buf) if end is None else end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise BytecodeError("truncated (a field runs past its section)")
        self.pos += 1
        return self.buf[self.pos - 1]

    def varint(self) -> int:
        """MLIR's PrefixVarInt: the first byte's trailing zeros say how many more bytes follow (none set: 8 more,
        holding the value whole); the bits above them, and the bytes after, are the value."""
        start, first = self.pos, self.byte()
        more = (first & -first).bit_length() - 1 if first else 8
        if self.pos + more > self.end:
            raise BytecodeError("truncated (a varint runs past its section)")
        self.pos += more
        if not first:
            return int.from_bytes(self.buf[start + 1:self.pos], "little")
        return int.from_bytes(self.buf[start:self.pos], "little") >> (more + 1)

    def align(self, alignment: int) -> None:
        if alignment & (alignment - 1):
            raise BytecodeError(f"alignment {alignment} is not a power of 2")
        self.pos = (self.pos + alignment - 1) & -alignment if alignment > 1 else self.pos


class StoredArray:
    """An array stored in a file (a resource blob), read piece by piece (``os.pread`` into a buffer of the piece's
    size: the file's pages stay in the page cache, never in the reader's memory)."""

    def __init__(self, fd: int, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.fd, self.offset, self.dtype, self.shape = fd, offset, np.dtype(dtype), shape
        self.size = int(np.prod(shape, dtype=np.int64))

    def read(self, start: int, count: int) -> np.ndarray:
        """Elements ``[start, start + count)`` in row-major order."""
        if start < 0 or count < 0 or start + count > self.size:
            raise BytecodeError(f"elements {start}..{start + count} are outside an array of {self.size}")
        n = count * self.dtype.itemsize
        data = os.pread(self.fd, n, self.offset + start * self.dtype.itemsize)
        if len(data) != n:
            raise BytecodeError("the file is shorter than its resource section says")
        return np.frombuffer(data, dtype=self.dtype)


class BlobIndex:
    """The resource blobs of one bytecode file: name → (offset in the file, size in bytes). Open it as a context
    manager; :meth:`stored` arrays are read while it is open."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = self.path.open("rb")
        try:  # the section table is read through a map (only its pages are touched), then the map is closed
            with mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                self.blobs = _index(buf)
        except (ValueError, BytecodeError) as e:  # ValueError: an empty file
            self._file.close()
            raise BytecodeError(f"{self.path}: {e}") from None

    def stored(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> StoredArray:
        """The blob ``name`` as an array of ``shape``, read on demand (:class:`StoredArray`)."""
        if name not in self.blobs:
            raise BytecodeError(f"{self.path}: no resource blob {name!r}")
        offset, size = self.blobs[name]
        out = StoredArray(self._file.fileno(), offset, dtype, shape)
        if out.size * out.dtype.itemsize != size:
            raise BytecodeError(f"{self.path}: resource {name!r} holds {size} bytes, not {out.size} × {out.dtype}")
        return out

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> BlobIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _index(buf) -> dict[str, tuple[int, int]]:
    if bytes(buf[:4]) != MAGIC:
        raise BytecodeError("not MLIR bytecode (no 'MLïR' magic)")
    r = _Reader(buf, 4)
    r.varint()  # version
    end = buf.find(b"\0", r.pos)
    if end < 0:
        raise BytecodeError("no producer string")
    r.pos = end + 1
    sections: dict[int, tuple[int, int]] = {}
    while r.pos < len(buf):
        head = r.byte()
        length = r.varint()
        if head & 0x80:
            r.align(r.varint())
        if r.pos + length > len(buf):
            raise BytecodeError(f"section {head & 0x7f} runs past the end of the file")
        sections[head & 0x7f] = (r.pos, r.pos + length)
        r.pos += length
    if _RESOURCE_OFFSETS not in sections:
        return {}
    if _STRINGS not in sections or _RESOURCES not in sections:
        raise BytecodeError("resources without a string or resource section")
    strings = _strings(buf, *sections[_STRINGS])
    offsets = _Reader(buf, *sections[_RESOURCE_OFFSETS])
    at, res_end = sections[_RESOURCES]
    out: dict[str, tuple[int, int]] = {}
    groups = offsets.varint()  # external groups first, then one group per dialect until the section ends
    while groups > 0 or offsets.pos < offsets.end:
        groups -= 1
        offsets.varint()  # the group's key (a string) or dialect (an index): not needed
        for _ in range(offsets.varint()):
            key, size, kind = offsets.varint(), offsets.varint(), offsets.byte()
            if key >= len(strings) or at + size > res_end:
                raise BytecodeError("a resource entry points outside its section")
            if kind == _BLOB:
                entry = _Reader(buf, at, at + size)
                alignment, n = entry.varint(), entry.varint()
                entry.align(alignment)
                if entry.pos + n > at + size:
                    raise BytecodeError(f"resource {strings[key]!r} runs past its entry")
                out[strings[key]] = (entry.pos, n)
            at += size
    return out


def _strings(buf, start: int, end: int) -> list[str]:
    r = _Reader(buf, start, end)
    lengths = [r.varint() for _ in range(r.varint())]
    out, stop = [], end
    for n in lengths:  # the lengths are in reverse order; each string ends with a NUL
        if n < 1 or stop - n < r.pos:
            raise BytecodeError("a string runs outside the string section")
        out.append(bytes(buf[stop - n:stop - 1]).decode("utf-8", "replace"))
        stop -= n
    return out[::-1]
