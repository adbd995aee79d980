"""Ops that move, select or create data: views (reshape, expand_dims, squeeze, transpose), slicing and
``slice_update``, gather/scatter, concat/split/stack/tile, band_part, pad, fill, range, cumsum, topk...

Semantics follow coremltools ``ops/defs/iOS15/tensor_{operation,transformation}.py``, ``scatter_gather.py`` and
their iOS16-18 versions: ``slice_by_index`` masks as ``_utils.solve_slice_by_index_slice``, ``gather``'s
``batch_dims`` as ``_utils.compute_gather`` (tf.gather), iOS17 ``reshape``'s right-aligned ``0``.
"""

from __future__ import annotations

import numpy as np

from analyzer.engines.interpret.ops._common import (
    OperandError,
    as_bool,
    as_bools,
    as_int,
    as_ints,
    axes_of,
    axis_in,
    describe,
    f32,
)
from analyzer.engines.interpret.registry import register
from analyzer.engines.interpret.values import CAST_NAMES, np_dtype


# ------------------------------------------------------------------------------------------------- views
@register("reshape")
def reshape(x, shape):
    """``0`` copies the input dimension it is right-aligned with (iOS17; the same as iOS15's positional ``0``
    when ``len(shape) == rank(x)``), or 1 past the input's rank; ``-1`` is inferred."""
    x = np.asarray(x)
    target = as_ints(shape)
    offset = x.ndim - len(target)
    target = [(x.shape[i + offset] if i + offset >= 0 else 1) if d == 0 else d for i, d in enumerate(target)]
    return x.reshape(target)


@register("expand_dims")
def expand_dims(x, axes):
    x = np.asarray(x)
    out_rank = x.ndim + len(as_ints(axes))
    shape = list(x.shape)
    for a in sorted(a + out_rank if a < 0 else a for a in as_ints(axes)):
        shape.insert(a, 1)
    return x.reshape(shape)


@register("squeeze")
def squeeze(x, axes=None):
    x = np.asarray(x)
    return np.squeeze(x) if axes is None else np.squeeze(x, axis=axes_of(axes, x.ndim))


@register("transpose")
def transpose(x, perm):
    return np.transpose(x, as_ints(perm))


@register("flatten2d")
def flatten2d(x, axis=1):
    """``[prod(x.shape[:axis]), prod(x.shape[axis:])]``; a negative axis counts as Python's slices do (``-1``: all
    but the last axis before), as coremltools' type inference reads it."""
    x = np.asarray(x)
    a = as_int(axis)
    if not -x.ndim <= a <= x.ndim:
        raise OperandError("x", f"is {describe(x)} (rank {x.ndim}): flatten2d has no axis {a} for it")
    return x.reshape(int(np.prod(x.shape[:a], dtype=np.int64)), int(np.prod(x.shape[a:], dtype=np.int64)))


@register("reverse")
def reverse(x, axes=None):
    x = np.asarray(x)
    return np.flip(x, axis=axes_of(axes, x.ndim))


# ------------------------------------------------------------------------------------------------- slicing
def index_slices(shape, begin, end, stride=None, begin_mask=None, end_mask=None, squeeze_mask=None) -> tuple:
    """The NumPy index of a MIL ``slice_by_index``: a masked begin/end is open, a squeezed axis is indexed by
    ``begin`` (so it is dropped from the result)."""
    rank = len(shape)
    begin, end = as_ints(begin), as_ints(end)
    stride = [1] * rank if stride is None else as_ints(stride)
    bm, em, sm = as_bools(begin_mask, rank), as_bools(end_mask, rank), as_bools(squeeze_mask, rank)
    index: list = []
    for i in range(rank):
        if sm[i]:
            index.append(begin[i])
        else:
            index.append(slice(None if bm[i] else begin[i], None if em[i] else end[i], stride[i]))
    return tuple(index)


@register("slice_by_index")
def slice_by_index(x, begin, end, stride=None, begin_mask=None, end_mask=None, squeeze_mask=None):
    x = np.asarray(x)
    return x[index_slices(x.shape, begin, end, stride, begin_mask, end_mask, squeeze_mask)]


@register("slice_by_size")
def slice_by_size(x, begin, size):
    x = np.asarray(x)
    index = tuple(slice(b, None if s == -1 else b + s) for b, s in zip(as_ints(begin), as_ints(size), strict=True))
    return x[index]


@register("slice_update")
def slice_update(x, update, begin, end, stride=None, begin_mask=None, end_mask=None, squeeze_mask=None):
    """``x`` with ``x[slices] = update``, a new array (MIL values are immutable)."""
    out = np.array(x, copy=True)
    index = index_slices(out.shape, begin, end, stride, begin_mask, end_mask, squeeze_mask)
    target = out[index]
    update = np.asarray(update)
    if update.size != target.size:
        raise OperandError("update", f"is {describe(update)}: it does not fit the slice of shape "
                                     f"{list(target.shape)} that begin/end select in x {describe(out)}")
    out[index] = update.reshape(target.shape)
    return out


@register("sliding_windows")
def sliding_windows(x, axis, size, stride=1):
    x = np.asarray(x)
    a, size, stride = axis_in(axis, x), as_int(size), as_int(stride)
    win = np.lib.stride_tricks.sliding_window_view(x, size, axis=a)  # [..., n, ..., size]
    win = np.take(win, np.arange(0, win.shape[a], stride), axis=a)
    return np.moveaxis(win, -1, a + 1)


# ------------------------------------------------------------------------------------------------- gather / scatter
def _gather(x, indices, axis):
    return np.take(x, indices, axis=axis)


@register("gather")
def gather(x, indices, axis=0, batch_dims=0, validate_indices=False):
    """``out.shape = x.shape[:axis] + indices.shape[batch_dims:] + x.shape[axis+1:]`` (tf.gather); negative
    indices count from the end. A memory-mapped ``x`` (an embedding) is read only at the gathered rows."""
    x, indices = np.asarray(x) if not isinstance(x, np.memmap) else x, np.asarray(indices).astype(np.int64)
    axis, batch_dims = axis_in(axis, x), as_int(batch_dims)
    if batch_dims == 0:
        return _gather(x, indices, axis)
    batch = x.shape[:batch_dims]
    n = int(np.prod(batch, dtype=np.int64))
    xs = x.reshape((n, *x.shape[batch_dims:]))
    ids = indices.reshape((n, *indices.shape[batch_dims:]))
    out = np.stack([_gather(xs[i], ids[i], axis - batch_dims) for i in range(n)])
    return out.reshape(batch + out.shape[1:])


@register("gather_along_axis")
def gather_along_axis(x, indices, axis=0, validate_indices=False):
    x = np.asarray(x)
    a = axis_in(axis, x)
    idx = np.asarray(indices).astype(np.int64)
    return np.take_along_axis(x, np.where(idx < 0, idx + x.shape[a], idx), axis=a)


def _nd_index(indices: np.ndarray) -> tuple:
    return tuple(np.moveaxis(indices, -1, 0))


@register("gather_nd")
def gather_nd(x, indices, batch_dims=0, validate_indices=False):
    """``out.shape = indices.shape[:-1] + x.shape[batch_dims + indices.shape[-1]:]``."""
    x, indices = np.asarray(x), np.asarray(indices).astype(np.int64)
    b = as_int(batch_dims)
    if b == 0:
        return x[_nd_index(indices)]
    batch = x.shape[:b]
    n = int(np.prod(batch, dtype=np.int64))
    xs = x.reshape((n, *x.shape[b:]))
    ids = indices.reshape((n, *indices.shape[b:]))
    out = np.stack([xs[i][_nd_index(ids[i])] for i in range(n)])
    return out.reshape(batch + out.shape[1:])


_SCATTER_MODES = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide,
                  "max": np.maximum, "min": np.minimum}


def _scatter_into(out: np.ndarray, index: tuple, updates: np.ndarray, mode: str) -> np.ndarray:
    if mode == "update":
        out[index] = updates
    elif mode in _SCATTER_MODES:
        _SCATTER_MODES[mode].at(out, index, updates)
    else:
        raise ValueError(f"scatter mode {mode!r} is not one of update, {', '.join(_SCATTER_MODES)}")
    return out


@register("scatter")
def scatter(data, indices, updates, axis=0, mode="add", validate_indices=False):
    """``updates.shape = data.shape[:axis] + indices.shape + data.shape[axis+1:]``."""
    out = np.array(f32(data), copy=True)
    a = axis_in(axis, out, "data")
    idx = np.asarray(indices).astype(np.int64)
    index = (slice(None),) * a + (idx,)
    return _scatter_into(out, index, f32(updates), mode)


@register("scatter_along_axis")
def scatter_along_axis(data, indices, updates, axis=0, mode="add", validate_indices=False):
    out = np.array(f32(data), copy=True)
    a = axis_in(axis, out, "data")
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + out.shape[a], idx)
    grids = list(np.indices(idx.shape, sparse=True))
    grids[a] = idx
    return _scatter_into(out, tuple(grids), f32(updates), mode)


@register("scatter_nd")
def scatter_nd(data, indices, updates, mode="add", validate_indices=False):
    out = np.array(f32(data), copy=True)
    return _scatter_into(out, _nd_index(np.asarray(indices).astype(np.int64)), f32(updates), mode)


# ------------------------------------------------------------------------------------------------- joining / splitting
@register("concat", variadic=("values",))
def concat(values, axis, interleave=False):
    """Rank-0 values are read as ``[1]`` (Core ML's reading, and coremltools' type inference): ``ct.convert``
    writes a shape as ``concat`` of scalars (constants and ``gather``-ed dimensions), a rank-1 result."""
    arrays = [np.asarray(v) for v in values]
    if not arrays:
        raise OperandError("values", "is empty: nothing to concatenate")
    if all(arr.ndim == 0 for arr in arrays):
        arrays = [arr.reshape(1) for arr in arrays]
    for i, arr in enumerate(arrays):
        if arr.ndim != arrays[0].ndim:
            raise OperandError(f"values[{i}]", f"is {describe(arr)}, not of the rank of values[0] "
                                               f"({describe(arrays[0])})")
    a = axis_in(axis, arrays[0], "values[0]")
    for i, arr in enumerate(arrays):
        if arr.shape[:a] + arr.shape[a + 1:] != arrays[0].shape[:a] + arrays[0].shape[a + 1:]:
            raise OperandError(f"values[{i}]", f"is {describe(arr)}: its sizes off axis {a} differ from values[0]'s "
                                               f"({describe(arrays[0])})")
    if not as_bool(interleave):
        return np.concatenate(arrays, axis=a)
    # interleave: output[i::n] along axis = values[i]; every input has the same shape
    stacked = np.stack(arrays, axis=a + 1)
    shape = list(arrays[0].shape)
    shape[a] *= len(arrays)
    return stacked.reshape(shape)


@register("stack", variadic=("values",))
def stack(values, axis):
    return np.stack([np.asarray(v) for v in values], axis=as_int(axis))


@register("split")
def split(x, axis, num_splits=None, split_sizes=None):
    x = np.asarray(x)
    a = axis_in(axis, x)
    if split_sizes is not None:
        sizes = as_ints(split_sizes)
    else:
        n = as_int(num_splits)
        if x.shape[a] % n:
            raise ValueError(f"axis {a} of size {x.shape[a]} does not split evenly into {n}")
        sizes = [x.shape[a] // n] * n
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=a))


@register("tile")
def tile(x, reps):
    """``np.tile`` in one copy: view ``x [s0, s1, ..]`` as ``[1, s0, 1, s1, ..]``, broadcast it to
    ``[r0, s0, r1, s1, ..]`` (no data moves) and reshape to ``[r0·s0, r1·s1, ..]`` (the one copy)."""
    x = np.asarray(x)
    r = as_ints(reps)
    r = [1] * (x.ndim - len(r)) + r
    shape = [1] * (len(r) - x.ndim) + list(x.shape)
    paired = [d for pair in zip(r, shape, strict=True) for d in pair]
    view = np.broadcast_to(x.reshape([d for s in shape for d in (1, s)]), paired)
    return view.reshape([a * b for a, b in zip(r, shape, strict=True)])


# ------------------------------------------------------------------------------------------------- masks and fills
@register("band_part")
def band_part(x, lower=-1, upper=-1):
    """Keep ``x[..., m, n]`` where ``(lower < 0 or m - n <= lower) and (upper < 0 or n - m <= upper)``, else 0."""
    x = np.asarray(x)
    lo, up = as_int(lower), as_int(upper)
    m = np.arange(x.shape[-2])[:, None]
    n = np.arange(x.shape[-1])[None, :]
    keep = ((lo < 0) | (m - n <= lo)) & ((up < 0) | (n - m <= up))
    return np.where(keep, x, np.zeros((), x.dtype))


@register("fill")
def fill(shape, value=0.0):
    value = np.asarray(value)
    return np.full(as_ints(shape), value, dtype=value.dtype)


@register("fill_like")
def fill_like(ref_tensor, value=0.0):
    value = np.asarray(value)
    return np.full(np.shape(ref_tensor), value, dtype=value.dtype)


@register("range_1d")
def range_1d(end, start, step):
    end, start, step = np.asarray(end), np.asarray(start), np.asarray(step)
    return np.arange(start.reshape(()), end.reshape(()), step.reshape(()), dtype=np.result_type(start, end, step))


@register("shape")
def shape(x):
    return np.array(np.shape(x), dtype=np.int32)


@register("one_hot")
def one_hot(indices, one_hot_vector_size, axis=-1, on_value=1, off_value=0):
    idx = np.asarray(indices).astype(np.int64)
    depth = as_int(one_hot_vector_size)
    on, off = np.asarray(on_value), np.asarray(off_value)
    hot = idx[..., None] == np.arange(depth)
    out = np.where(hot, on, off)
    a = as_int(axis)
    return np.moveaxis(out, -1, a if a >= 0 else out.ndim + a)


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}


@register("pad")
def pad(x, pad, mode="constant", constant_val=0.0):
    """``pad`` holds (before, after) pairs for the LAST ``len(pad) / 2`` axes."""
    x = np.asarray(x)
    p = as_ints(pad)
    pairs = [(0, 0)] * (x.ndim - len(p) // 2) + [(p[2 * i], p[2 * i + 1]) for i in range(len(p) // 2)]
    if mode not in _PAD_MODES:
        raise ValueError(f"pad mode {mode!r} is not one of {', '.join(_PAD_MODES)}")
    if mode == "constant":
        return np.pad(x, pairs, mode="constant", constant_values=np.asarray(constant_val).astype(x.dtype))
    return np.pad(x, pairs, mode=_PAD_MODES[mode])


# ------------------------------------------------------------------------------------------------- scans and sorts
@register("cumsum")
def cumsum(x, axis=0, exclusive=False, reverse=False):
    x = f32(x)
    a = axis_in(axis, x)
    if as_bool(reverse):
        x = np.flip(x, a)
    out = np.cumsum(x, axis=a, dtype=np.float32 if x.dtype.kind == "f" and x.dtype.itemsize <= 4 else None)
    if as_bool(exclusive):
        out = np.concatenate([np.zeros_like(np.take(out, [0], axis=a)), np.take(out, np.arange(out.shape[a] - 1),
                                                                                 axis=a)], axis=a)
    return np.flip(out, a) if as_bool(reverse) else out


def _sort_order(x: np.ndarray, axis: int, ascending: bool) -> np.ndarray:
    return np.argsort(x if ascending else -x.astype(np.float64), axis=axis, kind="stable")


@register("argsort")
def argsort(x, axis=-1, ascending=False):
    x = np.asarray(x)
    return _sort_order(x, axis_in(axis, x), as_bool(ascending)).astype(np.int32)


@register("topk")
def topk(x, k=1, axis=-1, ascending=False, sort=True, return_indices=True, output_indices_dtype="int32"):
    x = np.asarray(x)
    a = axis_in(axis, x)
    order = np.take(_sort_order(x, a, as_bool(ascending)), np.arange(as_int(k)), axis=a)
    values = np.take_along_axis(x, order, axis=a)
    return values, order.astype(np_dtype(CAST_NAMES.get(output_indices_dtype, "int32")))


@register("non_zero")
def non_zero(x):
    return np.argwhere(np.asarray(x)).astype(np.int32)
