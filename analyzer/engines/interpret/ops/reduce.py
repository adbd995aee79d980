"""Reductions, ``softmax`` and normalizations. Sums and means accumulate in fp32 (fp64 for fp64 data); the
interpreter rounds the result to the op's output dtype. Semantics: coremltools ``ops/defs/iOS15/reduction.py``
(``axes`` None = every axis) and ``normalization.py`` (``layer_norm``'s gamma/beta shaped ``x.shape[axes]``)."""

from __future__ import annotations

import numpy as np

from analyzer.engines.interpret.ops._common import as_bool, as_float, axes_of, axis_in, f32
from analyzer.engines.interpret.registry import register
from analyzer.engines.interpret.values import CAST_NAMES, np_dtype


def _reduction(fn, name):
    def kernel(x, axes=None, keep_dims=False):
        x = f32(x)
        return fn(x, axes_of(axes, x.ndim), as_bool(keep_dims))

    kernel.__name__ = name
    return kernel


_REDUCTIONS = {
    "reduce_sum": lambda x, a, k: np.sum(x, axis=a, keepdims=k),
    "reduce_mean": lambda x, a, k: np.mean(x, axis=a, keepdims=k),
    "reduce_max": lambda x, a, k: np.max(x, axis=a, keepdims=k),
    "reduce_min": lambda x, a, k: np.min(x, axis=a, keepdims=k),
    "reduce_prod": lambda x, a, k: np.prod(x, axis=a, keepdims=k),
    "reduce_l1_norm": lambda x, a, k: np.sum(np.abs(x), axis=a, keepdims=k),
    "reduce_l2_norm": lambda x, a, k: np.sqrt(np.sum(np.square(x), axis=a, keepdims=k)),
    "reduce_sum_square": lambda x, a, k: np.sum(np.square(x), axis=a, keepdims=k),
    "reduce_log_sum": lambda x, a, k: np.log(np.sum(x, axis=a, keepdims=k)),
    "reduce_log_sum_exp": lambda x, a, k: _logsumexp(x, a, k),
}


def _logsumexp(x, axes, keep):
    m = np.max(x, axis=axes, keepdims=True)
    out = np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m
    return out if keep else np.squeeze(out, axis=axes)


for _name, _fn in _REDUCTIONS.items():
    register(_name)(_reduction(_fn, _name))


def _arg(fn):
    def kernel(x, axis=-1, keep_dims=False, output_dtype="int32"):
        x = np.asarray(x)
        out = fn(x, axis=axis_in(axis, x), keepdims=as_bool(keep_dims))
        return out.astype(np_dtype(CAST_NAMES.get(output_dtype, "int32")))

    return kernel


register("reduce_argmax")(_arg(np.argmax))
register("reduce_argmin")(_arg(np.argmin))


@register("softmax")
def softmax(x, axis=-1):
    a = axis_in(axis, x)
    x = f32(x)
    e = np.exp(x - np.max(x, axis=a, keepdims=True))
    return e / np.sum(e, axis=a, keepdims=True)


@register("layer_norm")
def layer_norm(x, axes=None, gamma=None, beta=None, epsilon=1e-5):
    """``(x - mean) / sqrt(var + epsilon) * gamma + beta`` over ``axes`` (None = every axis)."""
    x = f32(x)
    ax = axes_of(axes, x.ndim) or tuple(range(x.ndim))
    norm_shape = [x.shape[i] if i in ax else 1 for i in range(x.ndim)]
    centred = x - np.mean(x, axis=ax, keepdims=True)
    out = centred / np.sqrt(np.mean(np.square(centred), axis=ax, keepdims=True) + as_float(epsilon))
    if gamma is not None:
        out = out * f32(gamma).reshape(norm_shape)
    if beta is not None:
        out = out + f32(beta).reshape(norm_shape)
    return out


def _channel(p, x: np.ndarray) -> np.ndarray:
    return f32(p).reshape((1, -1) + (1,) * (x.ndim - 2))


@register("batch_norm")
def batch_norm(x, mean, variance, gamma=None, beta=None, epsilon=1e-5):
    x = f32(x)
    out = (x - _channel(mean, x)) / np.sqrt(_channel(variance, x) + as_float(epsilon))
    if gamma is not None:
        out = out * _channel(gamma, x)
    return out if beta is None else out + _channel(beta, x)


@register("instance_norm")
def instance_norm(x, gamma=None, beta=None, epsilon=1e-5):
    x = f32(x)
    ax = tuple(range(2, x.ndim))
    centred = x - np.mean(x, axis=ax, keepdims=True)
    out = centred / np.sqrt(np.mean(np.square(centred), axis=ax, keepdims=True) + as_float(epsilon))
    if gamma is not None:
        out = out * _channel(gamma, x)
    return out if beta is None else out + _channel(beta, x)


@register("l2_norm")
def l2_norm(x, epsilon=1e-6):
    """``x / sqrt(sum(x²) + epsilon)`` over the last three axes (all axes when rank ≤ 3)."""
    x = f32(x)
    ax = tuple(range(max(0, x.ndim - 3), x.ndim))
    return x / np.sqrt(np.sum(np.square(x), axis=ax, keepdims=True) + as_float(epsilon))
