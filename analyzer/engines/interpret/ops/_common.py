"""Small helpers the kernels share: parameter coercion and the fp32 compute rule."""

from __future__ import annotations

import functools
import sys
import warnings

import numpy as np

from analyzer.engines.interpret.values import NP_DTYPES

# fp16 → fp32 widening is exact, so any converter gives the same values (a NaN stays a NaN). NumPy's half →
# float cast is a scalar loop (~1 G elements per CPU-second here); torch's is vectorized (F16C), 8x faster per
# element measured on this machine. A full-size decode step widens ~1.8 G elements (every weight once, the
# replicated KV), so the interpreter borrows torch's conversion when torch is installed (qfold's own requirements
# pin it). It copies in chunks of at most torch's parallel grain size (``at::internal::GRAIN_SIZE`` = 32768), so
# each copy runs on the calling thread: a 2-thread copy of 128 Ki elements took 100x the CPU time on the loaded
# 2-core machine. Importing torch costs ~3 s of CPU, what NumPy takes to widen ~3 G elements: a process that has
# not imported it widens with NumPy until it has widened TORCH_AFTER_ELEMENTS (a small program never imports it).
WIDEN_CHUNK = 32768
TORCH_AFTER_ELEMENTS = 1 << 29
_widened = [0]  # elements widened by NumPy in this process


@functools.cache
def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover  (torch is a qfold requirement; NumPy alone also works)
        return None
    return torch


def widen_into(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    """``dst[...] = src`` for fp16 ``src`` and fp32 ``dst`` of the same shape (exact); returns ``dst``."""
    if "torch" not in sys.modules and _widened[0] < TORCH_AFTER_ELEMENTS:
        _widened[0] += src.size
        np.copyto(dst, src)
        return dst
    torch = _torch()
    if torch is None or src.dtype != np.float16 or not (src.flags.c_contiguous and dst.flags.c_contiguous):
        np.copyto(dst, src)
        return dst
    with warnings.catch_warnings():  # a memory-mapped weight is read-only; torch only reads it here
        warnings.simplefilter("ignore", UserWarning)
        s = torch.from_numpy(src.reshape(-1))
    d = torch.from_numpy(dst.reshape(-1))
    for i in range(0, s.numel(), WIDEN_CHUNK):
        d[i:i + WIDEN_CHUNK].copy_(s[i:i + WIDEN_CHUNK])
    return dst


def f32(x: np.ndarray) -> np.ndarray:
    """Float data at fp32 or better (fp64 stays fp64); integers and bools unchanged. Kernels compute on this
    and the interpreter rounds the result once to the op's declared output dtype."""
    x = np.asarray(x)
    if x.dtype != np.float16:
        return x
    if x.size >= WIDEN_CHUNK and x.flags.c_contiguous:
        return widen_into(np.empty(x.shape, np.float32), x)
    return x.astype(np.float32)


def as_int(v) -> int:
    return int(np.asarray(v).reshape(()))


def as_bool(v) -> bool:
    return bool(np.asarray(v).reshape(()))


def as_float(v) -> float:
    return float(np.asarray(v).reshape(()))


def as_ints(v) -> list[int]:
    return [int(i) for i in np.asarray(v).reshape(-1)]


def as_bools(v, n: int) -> list[bool]:
    return [False] * n if v is None else [bool(b) for b in np.asarray(v).reshape(-1)]


class OperandError(ValueError):
    """A kernel cannot run one of its operands: which parameter (``"x"``, ``"values[2]"``) and why. The interpreter
    adds the op's name and type (``executor.call_kernel``)."""

    def __init__(self, operand: str, why: str):
        super().__init__(f"operand {operand!r} {why}")
        self.operand, self.why = operand, why


def describe(value) -> str:
    """An operand as a type and shape for an error message: ``int32[]``, ``fp16[1,2,0,8]``, ``'int16'``."""
    if isinstance(value, str):
        return repr(value)
    arr = np.asarray(value)
    dtype = next((k for k, v in NP_DTYPES.items() if v == arr.dtype), str(arr.dtype))  # the MIL name: fp16
    return f"{dtype}[{','.join(map(str, arr.shape))}]"


def axis_in(axis, x: np.ndarray, operand: str = "x", extra: int = 0) -> int:
    """A MIL ``axis`` of ``x`` (``extra``: one past the rank allowed, as expand_dims's) as a non-negative axis; an
    axis ``x`` does not have is an :class:`OperandError` naming ``operand``."""
    a, rank = as_int(axis), np.ndim(x) + extra
    if not -rank <= a < rank:
        raise OperandError(operand, f"is {describe(x)} (rank {np.ndim(x)}): it has no axis {a}")
    return a % rank


def axes_of(axes, rank: int, operand: str = "x") -> tuple[int, ...] | None:
    """A MIL ``axes`` parameter (None = all) as non-negative axes; one the operand lacks is an OperandError."""
    if axes is None:
        return None
    out = []
    for a in as_ints(axes):
        if not -rank <= a < rank and not (rank == 0 and a in (0, -1)):
            raise OperandError(operand, f"has rank {rank}: it has no axis {a}")
        out.append(a % rank if rank else 0)
    return tuple(out)
