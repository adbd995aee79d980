"""Small helpers the kernels share: parameter coercion and the fp32 compute rule."""

from __future__ import annotations

import numpy as np


def f32(x: np.ndarray) -> np.ndarray:
    """Float data at fp32 or better (fp64 stays fp64); integers and bools unchanged. Kernels compute on this
    and the interpreter rounds the result once to the op's declared output dtype."""
    x = np.asarray(x)
    if x.dtype == np.float16:
        return x.astype(np.float32)
    return x


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


def axes_of(axes, rank: int) -> tuple[int, ...] | None:
    """A MIL ``axes`` parameter (None = all) as non-negative axes."""
    if axes is None:
        return None
    return tuple(a % rank if rank else 0 for a in as_ints(axes))
