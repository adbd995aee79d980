"""Elementwise ops: binary arithmetic and comparisons (NumPy broadcasting, as MIL's), unary math, activations,
``cast``, ``clip``, ``select``. Semantics from coremltools ``ops/defs/iOS15/{elementwise_binary,
elementwise_unary,activation}.py`` and their iOS17 versions (``epsilon`` defaults, gelu modes)."""

from __future__ import annotations

import numpy as np

from analyzer.engines.interpret.ops._common import as_float, f32
from analyzer.engines.interpret.registry import register
from analyzer.engines.interpret.values import CAST_NAMES, np_dtype

# ------------------------------------------------------------------------------------------------- binary
_BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "real_div": np.true_divide,
    "floor_div": np.floor_divide, "pow": np.power, "maximum": np.maximum, "minimum": np.minimum,
    "mod": np.mod,  # x - floor(x / y) * y, the sign of y (coremltools value_inference: operator.mod)
    "equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
    "greater": np.greater, "greater_equal": np.greater_equal,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
}


def _binary(ufunc):
    def kernel(x, y):
        return ufunc(f32(x), f32(y))

    kernel.__name__ = ufunc.__name__
    return kernel


for _name, _ufunc in _BINARY.items():
    register(_name)(_binary(_ufunc))


# ------------------------------------------------------------------------------------------------- unary
def _erf(x: np.ndarray) -> np.ndarray:
    """erf to |error| ≤ 1.5e-7 (Abramowitz & Stegun, Handbook of Mathematical Functions, 7.1.26), below fp32's
    resolution of values near 1; NumPy has no erf and SciPy is not a dependency."""
    x = np.asarray(x, dtype=np.float64)
    s, a = np.sign(x), np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return s * (1.0 - poly * np.exp(-a * a))


_UNARY = {
    "abs": np.abs, "acos": np.arccos, "asin": np.arcsin, "atan": np.arctan, "atanh": np.arctanh, "ceil": np.ceil,
    "cos": np.cos, "cosh": np.cosh, "exp": np.exp, "exp2": np.exp2, "floor": np.floor, "logical_not": np.logical_not,
    "round": np.round,  # half to even, as coremltools' value_inference
    "sign": np.sign, "sin": np.sin, "sinh": np.sinh, "sqrt": np.sqrt, "square": np.square, "tan": np.tan,
    "tanh": np.tanh, "erf": _erf, "identity": lambda x: x,
    "relu": lambda x: np.maximum(x, 0), "relu6": lambda x: np.clip(x, 0, 6),
    "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)), "silu": lambda x: x / (1.0 + np.exp(-x)),
    "softplus": lambda x: np.logaddexp(0, x), "softsign": lambda x: x / (1.0 + np.abs(x)),
}


def _unary(fn, name):
    def kernel(x):
        return fn(f32(x))

    kernel.__name__ = name
    return kernel


for _name, _fn in _UNARY.items():
    register(_name)(_unary(_fn, _name))


@register("inverse")
def inverse(x, epsilon=1e-4):
    return 1.0 / (f32(x) + as_float(epsilon))


@register("log")
def log(x, epsilon=1e-45):
    return np.log(f32(x) + np.float32(as_float(epsilon)))


@register("rsqrt")
def rsqrt(x, epsilon=1e-12):
    return 1.0 / np.sqrt(f32(x) + np.float32(as_float(epsilon)))


@register("threshold")
def threshold(x, alpha):
    return np.maximum(f32(x), f32(alpha))


@register("clip")
def clip(x, alpha, beta):
    return np.minimum(np.maximum(f32(x), f32(alpha)), f32(beta))


@register("cast")
def cast(x, dtype):
    if dtype not in CAST_NAMES:
        raise ValueError(f"cast to {dtype!r} is not a MIL cast dtype")
    return np.asarray(x).astype(np_dtype(CAST_NAMES[dtype]))


@register("select")
def select(cond, a, b):
    return np.where(np.asarray(cond).astype(bool), a, b)


# ------------------------------------------------------------------------------------------------- activations
_SQRT_2_OVER_PI = np.sqrt(2.0 / np.pi)


@register("gelu")
def gelu(x, mode="EXACT"):
    x = f32(x)
    if mode == "EXACT":
        return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))
    if mode == "TANH_APPROXIMATION":
        return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))
    if mode == "SIGMOID_APPROXIMATION":
        return x / (1.0 + np.exp(-1.702 * x))
    raise ValueError(f"gelu mode {mode!r} is not one of EXACT, TANH_APPROXIMATION, SIGMOID_APPROXIMATION")


@register("leaky_relu")
def leaky_relu(x, alpha):
    x = f32(x)
    return np.where(x >= 0, x, as_float(alpha) * x)


@register("elu")
def elu(x, alpha):
    x = f32(x)
    return np.where(x > 0, x, as_float(alpha) * (np.exp(x) - 1.0))


def _per_channel(param, x: np.ndarray) -> np.ndarray:
    """A per-channel parameter ``[C]`` broadcast over ``x`` ``[B, C, ...]``."""
    p = f32(param)
    return p.reshape((1, -1) + (1,) * (x.ndim - 2)) if p.ndim == 1 and x.ndim >= 2 else p


@register("prelu")
def prelu(x, alpha):
    x = f32(x)
    return np.where(x >= 0, x, _per_channel(alpha, x) * x)


@register("clamped_relu")
def clamped_relu(x, alpha, beta):
    x = f32(x)
    return np.minimum(np.where(x >= 0, x, as_float(alpha) * x), as_float(beta))


@register("scaled_tanh")
def scaled_tanh(x, alpha, beta):
    return as_float(alpha) * np.tanh(as_float(beta) * f32(x))


@register("sigmoid_hard")
def sigmoid_hard(x, alpha, beta):
    return np.clip(as_float(alpha) * f32(x) + as_float(beta), 0.0, 1.0)


@register("linear_activation")
def linear_activation(x, alpha, beta):
    return as_float(alpha) * f32(x) + as_float(beta)


@register("thresholded_relu")
def thresholded_relu(x, alpha):
    x = f32(x)
    return np.where(x > as_float(alpha), x, 0.0)


@register("softplus_parametric")
def softplus_parametric(x, alpha, beta):
    x = f32(x)
    return _per_channel(alpha, x) * np.logaddexp(0, _per_channel(beta, x) * x)
