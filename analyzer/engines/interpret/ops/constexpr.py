"""Compressed weights: the ``constexpr_*`` ops (iOS16 and iOS18 forms) and iOS17 ``quantize``/``dequantize``.

Every input of a ``constexpr_*`` op is constant, so the interpreter evaluates each one once, on first use, and
keeps the dense result (Core ML decompresses them at load or run time; either way the values are these).
Each op computes as coremltools' own ``decompress`` does (``affine_dequantize``: fp32, rounded once;
``blockwise_shift_scale``: in the scale's dtype), so the dense values equal ``decompress_weights``' bit for bit.
Semantics and layouts: coremltools
``ops/defs/iOS16/constexpr_ops.py`` and ``iOS18/compression.py`` (``decompress`` methods) and
``optimize/_utils.py`` (``lut_to_dense``, ``dequantize_by_scale_and_zp``).
"""

from __future__ import annotations

import numpy as np

from analyzer.engines.interpret.ops._common import as_int, as_ints, f32
from analyzer.engines.interpret.registry import register
from analyzer.engines.interpret.values import CAST_NAMES, np_dtype, unpack_bits


def _promote(param: np.ndarray, rank: int, axis: int | None) -> np.ndarray:
    """A scalar or a vector along ``axis`` as a tensor of ``rank`` (``promote_rank_to_same_as_data``)."""
    param = np.asarray(param)
    if param.ndim == rank:
        return param
    if param.ndim == 0:
        return param.reshape((1,) * rank)
    a = axis % rank
    return param.reshape([param.shape[0] if i == a else 1 for i in range(rank)])


def _block_repeat(param: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Repeat each entry of a blockwise parameter over its block (``block[i] = shape[i] / param.shape[i]``),
    on the leading ``len(shape)`` axes."""
    for i, n in enumerate(shape):
        if param.shape[i] != n:
            if n % param.shape[i]:
                raise ValueError(f"axis {i}: {param.shape[i]} blocks do not divide size {n}")
            param = np.repeat(param, n // param.shape[i], axis=i)
    return param


@register("constexpr_affine_dequantize")
def constexpr_affine_dequantize(quantized_data, zero_point, scale, axis):
    """iOS16: ``scale * (quantized_data - zero_point)``; scale/zero_point scalars or vectors along ``axis``."""
    q = np.asarray(quantized_data).astype(np.float32)
    a = as_int(axis)
    return _promote(f32(scale), q.ndim, a) * (q - _promote(np.asarray(zero_point).astype(np.float32), q.ndim, a))


@register("dequantize")
def dequantize(input, scale, zero_point=None, axis=None):
    """iOS17: ``scale * (input - zero_point)``."""
    q = np.asarray(input).astype(np.float32)
    a = None if axis is None else as_int(axis)
    zp = 0.0 if zero_point is None else _promote(np.asarray(zero_point).astype(np.float32), q.ndim, a)
    return _promote(f32(scale), q.ndim, a) * (q - zp)


@register("quantize")
def quantize(input, scale, output_dtype, zero_point=None, axis=None):
    """iOS17: ``clip(round(input / scale) + zero_point)`` to the range of ``output_dtype`` (int8 / uint8)."""
    x = f32(input)
    a = None if axis is None else as_int(axis)
    zp = 0.0 if zero_point is None else _promote(np.asarray(zero_point).astype(np.float32), x.ndim, a)
    info = np.iinfo(np_dtype(output_dtype))
    return np.clip(np.round(x / _promote(f32(scale), x.ndim, a)) + zp, info.min, info.max)


@register("constexpr_cast")
def constexpr_cast(source_val, output_dtype):
    return np.asarray(source_val).astype(np_dtype(CAST_NAMES[output_dtype]))


@register("constexpr_lut_to_dense")
def constexpr_lut_to_dense(indices, lut, shape=None, vector_axis=None):
    """iOS16 (``shape`` given): ``indices`` are bytes packing ``log2(len(lut))``-bit indices LSB first; the
    output is ``lut[indices].reshape(shape)``.
    iOS18: ``indices`` (uint1..uint8, unpacked) index per-block LUTs ``lut [*blocks, 2^nbits, VECTOR_SIZE]``;
    with ``VECTOR_SIZE > 1`` each index yields a vector laid along ``vector_axis``."""
    lut = np.asarray(lut)
    if shape is not None:
        out_shape = as_ints(shape)
        nbits = int(np.log2(lut.size))
        idx = unpack_bits(np.asarray(indices), nbits, int(np.prod(out_shape, dtype=np.int64)), signed=False)
        return lut[idx].reshape(out_shape)
    idx = np.asarray(indices).astype(np.intp)
    vector = lut.shape[-1]
    if vector > 1:
        a = as_int(vector_axis) % idx.ndim
        idx = np.swapaxes(idx, -1, a)
        lut = np.swapaxes(lut, -3, a)
    # every element's own table: repeat the per-block tables over the block, then pick the indexed entry
    tables = _block_repeat(lut, idx.shape)  # [*idx.shape, 2^nbits, VECTOR_SIZE]
    out = np.take_along_axis(tables, idx[..., None, None], axis=-2)[..., 0, :]  # [*idx.shape, VECTOR_SIZE]
    out = out.reshape(*idx.shape[:-1], idx.shape[-1] * vector)
    return np.swapaxes(out, -1, a) if vector > 1 else out


@register("constexpr_blockwise_shift_scale")
def constexpr_blockwise_shift_scale(data, scale, offset=None):
    """iOS18: ``scale * (data - offset)``, each scale/offset entry covering a block of
    ``data.shape[i] / scale.shape[i]`` along every axis i. Computed in the scale's dtype as coremltools'
    ``decompress`` does (integer data and offsets are exact in fp16), so a package and its
    ``coremltools.optimize.coreml.decompress_weights`` twin hold bit-identical weights."""
    s = np.asarray(scale)
    d = np.asarray(data).astype(s.dtype)
    if offset is not None:
        d = d - _block_repeat(np.asarray(offset), d.shape).astype(s.dtype)
    return _block_repeat(s, d.shape) * d


@register("constexpr_sparse_to_dense")
def constexpr_sparse_to_dense(nonzero_data, mask, shape=None):
    """iOS16: ``mask`` is bytes of bits (LSB first) over ``shape``; iOS18: ``mask`` is a uint1 tensor."""
    nonzero = np.asarray(nonzero_data)
    if shape is not None:
        out_shape = as_ints(shape)
        bits = unpack_bits(np.asarray(mask), 1, int(np.prod(out_shape, dtype=np.int64)), signed=False)
        out = np.zeros(bits.size, dtype=nonzero.dtype)
        out[bits != 0] = nonzero
        return out.reshape(out_shape)
    m = np.asarray(mask)
    out = np.zeros(m.shape, dtype=nonzero.dtype)
    out[m != 0] = nonzero
    return out


@register("constexpr_lut_to_sparse")
def constexpr_lut_to_sparse(indices_mask, indices_nonzero_data, lut, vector_axis=None):
    """iOS18: palettized non-zeros → (mask, values); the mask widens along ``vector_axis`` for vector LUTs."""
    dense_idx = constexpr_sparse_to_dense(indices_nonzero_data, indices_mask)
    dense = constexpr_lut_to_dense(dense_idx, lut, vector_axis=vector_axis)
    mask = np.asarray(indices_mask)
    vector = np.asarray(lut).shape[-1]
    if vector > 1:
        mask = np.repeat(mask, vector, axis=as_int(vector_axis) % mask.ndim)
    return mask, dense[mask != 0].reshape(-1)


@register("constexpr_sparse_blockwise_shift_scale")
def constexpr_sparse_blockwise_shift_scale(data_mask, nonzero_data, scale, offset=None):
    """iOS18: dequantize the non-zeros of a sparse tensor blockwise → (mask, values)."""
    mask = np.asarray(data_mask)
    dense = constexpr_sparse_to_dense(nonzero_data, mask)
    values = constexpr_blockwise_shift_scale(dense, scale, offset)
    return mask, values[mask != 0].reshape(-1)
