"""Products: ``matmul``, ``linear``, ``einsum``, ``conv`` and iOS18 ``scaled_dot_product_attention``.

Precision: operands are widened to fp32 and the products accumulate in fp32 (BLAS sgemm); the interpreter
then rounds the result once to the op's output dtype (fp16 in an fp16 graph). NumPy has no fp16 BLAS, and fp32
accumulation is what fp16 matrix engines do too, so this is the closest stand-in for a device result that the
CPU can compute quickly.

Weights stay fp16 memory-mapped views. A large operand is widened in blocks of ``BLOCK_ELEMS`` right before
use, one BLAS call per block: the fp32 block stays in the core's L2 cache, a decode step never holds an fp32 copy
of the model (``lm_head`` alone would be 0.8 GB), and each BLAS call is small enough that OpenBLAS keeps it on
one thread (measured here: on a loaded 2-core machine, multi-threaded GEMV calls of 0.5M+ elements ran up to 8x
slower per CPU-second than single-threaded 128K-element blocks; bench/interpret_full_size.py).
"""

from __future__ import annotations

import numpy as np

from analyzer.engines.interpret.ops._common import as_bool, as_int, as_ints, f32, widen_into
from analyzer.engines.interpret.registry import register

BLOCK_ELEMS = 1 << 17  # 128 Ki elements per widened block: 512 KiB of fp32, well inside a 2 MiB L2


def _is_narrow(a) -> bool:
    return np.asarray(a).dtype == np.float16


def _linear_f32(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """``x @ weight.T`` for ``x [..., in]``, ``weight [out, in]``, accumulated in fp32, the weight widened in
    blocks of output rows into one reused buffer."""
    x32 = f32(x)
    out_features, in_features = weight.shape
    if not _is_narrow(weight) or weight.size <= BLOCK_ELEMS:
        return x32 @ f32(weight).T
    out = np.empty((out_features, *x32.shape[:-1]), dtype=np.float32)  # [out, ...]: each block's rows contiguous
    xt = np.ascontiguousarray(np.moveaxis(x32, -1, 0).reshape(in_features, -1))  # [in, N]
    rows = max(1, BLOCK_ELEMS // max(1, in_features))
    flat = out.reshape(out_features, -1)
    buf = np.empty((rows, in_features), dtype=np.float32)
    contiguous = weight.flags.c_contiguous
    for start in range(0, out_features, rows):
        n = min(rows, out_features - start)
        block = weight[start:start + n]
        widen_into(buf[:n], block if contiguous else np.ascontiguousarray(block))
        np.matmul(buf[:n], xt, out=flat[start:start + n])
    return np.moveaxis(out, 0, -1)


def _batched_matmul_f32(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x @ y`` (rank ≥ 2, broadcast batch axes) with fp32 accumulation, widening one batch slice at a time
    (attention over a long cache: ``[1, H, 1, D] @ [1, H, D, S]``)."""
    batch = np.broadcast_shapes(x.shape[:-2], y.shape[:-2])
    xb = np.broadcast_to(x, (*batch, *x.shape[-2:]))
    yb = np.broadcast_to(y, (*batch, *y.shape[-2:]))
    out = np.empty((*batch, x.shape[-2], y.shape[-1]), dtype=np.float32)
    bufs = {}

    def wide(a: np.ndarray, key: str) -> np.ndarray:
        if a.dtype != np.float16:
            return a
        transposed = not a.flags.c_contiguous and a.T.flags.c_contiguous  # K viewed as Kᵀ: widen K, pass Kᵀ
        src = a.T if transposed else np.ascontiguousarray(a)
        if key not in bufs:
            bufs[key] = np.empty(src.shape, np.float32)
        dst = widen_into(bufs[key], src)
        return dst.T if transposed else dst

    for idx in np.ndindex(*batch):
        np.matmul(wide(xb[idx], "x"), wide(yb[idx], "y"), out=out[idx])
    return out


@register("linear")
def linear(x, weight, bias=None):
    """``x [..., in]`` · ``weight [out, in]``ᵀ + ``bias [out]``."""
    out = _linear_f32(np.asarray(x), np.asarray(weight))
    return out if bias is None else out + f32(bias)


@register("matmul")
def matmul(x, y, transpose_x=False, transpose_y=False):
    """NumPy ``matmul`` broadcasting (rank-1 operands as in NumPy), optional transposes of the last two axes."""
    x, y = np.asarray(x), np.asarray(y)
    if as_bool(transpose_x):
        x = np.swapaxes(x, -1, -2)
    if as_bool(transpose_y):
        y = np.swapaxes(y, -1, -2)
    if y.ndim == 2 and x.ndim >= 1 and y.size > BLOCK_ELEMS and _is_narrow(y):
        return _linear_f32(x, y.T)  # a large 2-D weight: widen it in blocks
    if x.ndim > 2 or y.ndim > 2:
        if x.ndim >= 2 and y.ndim >= 2 and max(x.size, y.size) > BLOCK_ELEMS and (_is_narrow(x) or _is_narrow(y)):
            return _batched_matmul_f32(x, y)
    return np.matmul(f32(x), f32(y))


@register("einsum", variadic=("values",))
def einsum(values, equation):
    """NumPy's einsum, after broadcasting a size-1 axis to the size its label has in the other operand: Core ML's
    einsum broadcasts (coremltools' type inference admits ``h`` of 1 against any ``h`` in ``nchw,nwhu->nchu``),
    NumPy's does not."""
    arrays = [f32(v) for v in values]
    labels = [t.strip() for t in equation.split("->")[0].split(",")]
    if len(labels) == len(arrays) and all(len(t) == a.ndim and t.isalpha() for t, a in zip(labels, arrays,
                                                                                            strict=True)):
        size: dict[str, int] = {}
        for t, a in zip(labels, arrays, strict=True):
            for label, d in zip(t, a.shape, strict=True):
                size[label] = d if size.get(label, 1) == 1 else size[label]
        arrays = [np.broadcast_to(a, [size[label] for label in t]) for t, a in zip(labels, arrays, strict=True)]
    return np.einsum(equation, *arrays, optimize=True)


def _same_padding(size: int, kernel: int, stride: int, dilation: int, lower: bool) -> tuple[int, int]:
    """TF-style "same": output = ceil(size / stride); the odd extra pixel goes after (``same``) or before
    (``same_lower``)."""
    out = -(-size // stride)
    total = max(0, (out - 1) * stride + (kernel - 1) * dilation + 1 - size)
    small, big = total // 2, total - total // 2
    return (big, small) if lower else (small, big)


@register("conv")
def conv(x, weight, bias=None, strides=None, pad_type="valid", pad=None, dilations=None, groups=1):
    """N-d convolution (MIL ``conv``): ``x [B, C_in, *D]``, ``weight [C_out, C_in / groups, *K]``. Built from
    strided sliding windows and one fp32 einsum per group."""
    x32, w = f32(x), f32(weight)
    spatial = x32.ndim - 2
    strides = [1] * spatial if strides is None else as_ints(strides)
    dilations = [1] * spatial if dilations is None else as_ints(dilations)
    kernel = w.shape[2:]
    if pad_type == "custom":
        p = [0] * 2 * spatial if pad is None else as_ints(pad)
        pads = [(p[2 * i], p[2 * i + 1]) for i in range(spatial)]
    elif pad_type == "valid":
        pads = [(0, 0)] * spatial
    elif pad_type in ("same", "same_lower"):
        pads = [_same_padding(x32.shape[2 + i], kernel[i], strides[i], dilations[i], pad_type == "same_lower")
                for i in range(spatial)]
    else:
        raise ValueError(f"conv pad_type {pad_type!r} is not one of valid, same, same_lower, custom")
    x32 = np.pad(x32, [(0, 0), (0, 0), *pads])
    # windows [B, C_in, *O, *K_dilated] → keep every dilation-th tap and every stride-th window
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    win = np.lib.stride_tricks.sliding_window_view(x32, span, axis=tuple(range(2, 2 + spatial)))
    win = win[(slice(None), slice(None), *(slice(None, None, s) for s in strides),
               *(slice(None, None, d) for d in dilations))]
    g = as_int(groups)
    c_in, c_out = x32.shape[1] // g, w.shape[0] // g
    letters = "defghijk"[:spatial]
    taps = "pqrstuvw"[:spatial]
    eq = f"bc{letters}{taps},oc{taps}->bo{letters}"
    out = np.concatenate([np.einsum(eq, win[:, i * c_in:(i + 1) * c_in], w[i * c_out:(i + 1) * c_out], optimize=True)
                          for i in range(g)], axis=1)
    if bias is not None:
        out = out + f32(bias).reshape((1, -1) + (1,) * spatial)
    return out


@register("scaled_dot_product_attention")
def scaled_dot_product_attention(query, key, value, attn_mask=None):
    """``softmax(Q Kᵀ / sqrt(D) + mask) V`` (iOS18); a bool mask keeps True slots (False → -inf)."""
    q, k, v = f32(query), f32(key), f32(value)
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) / np.sqrt(np.float32(q.shape[-1]))
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        scores = np.where(m, scores, -np.inf) if m.dtype == np.bool_ else scores + f32(m)
    scores = scores - scores.max(axis=-1, keepdims=True)
    w = np.exp(scores)
    return np.matmul(w / w.sum(axis=-1, keepdims=True), v)
