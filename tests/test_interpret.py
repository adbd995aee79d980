"""The MIL interpreter on hand-built programs: one small program per op family, saved as a real package and
run by ``analyzer.engines.interpret``, against NumPy / torch reference arithmetic.

Tolerances: an fp16 op's result is the fp32 result rounded once to fp16, so it is within half an fp16 ulp of
the reference (relative 2^-11 ≈ 4.9e-4); the checks allow 1e-3 relative (+1e-3 absolute for values near 0).
Data-movement and integer ops must match exactly.
"""

from __future__ import annotations

import sys

import coremltools as ct
import numpy as np
import pytest
import torch
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from analyzer.engines.interpret import load_interpreter, supported_op_types
from analyzer.engines.interpret.values import unpack_bits
from analyzer.errors import InterpretError, MilError, UnknownOpError

RNG = np.random.default_rng(7)
FP16_RTOL, FP16_ATOL = 1e-3, 1e-3


def _save(prog, path, target=ct.target.iOS18):
    ct.convert(prog, convert_to="mlprogram", pass_pipeline=ct.PassPipeline.EMPTY,
               minimum_deployment_target=target).save(str(path))
    return path


def _close(got: np.ndarray, want, rtol=FP16_RTOL, atol=FP16_ATOL):
    want = np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol, atol=atol)


def _f16(*shape, positive=False):
    x = RNG.standard_normal(shape).astype(np.float16)
    return (np.abs(x) + np.float16(0.5)) if positive else x


# ------------------------------------------------------------------------------------------------- elementwise
X, Y, P = _f16(2, 3, 4), _f16(1, 3, 4), _f16(2, 3, 4, positive=True)
x64, y64, p64 = (a.astype(np.float64) for a in (X, Y, P))


def _erf(v):
    return torch.erf(torch.from_numpy(v)).numpy()


ELEMENTWISE = {
    "add": x64 + y64, "sub": x64 - y64, "mul": x64 * y64, "real_div": x64 / p64, "maximum": np.maximum(x64, y64),
    "minimum": np.minimum(x64, y64), "pow": p64 ** y64, "floor_div": np.floor_divide(x64, p64),
    "mod": np.mod(x64, p64), "exp": np.exp(x64), "log": np.log(p64), "sqrt": np.sqrt(p64),
    "rsqrt": 1 / np.sqrt(p64 + 1e-5), "inverse": 1 / (p64 + 1e-4), "tanh": np.tanh(x64),
    "sigmoid": 1 / (1 + np.exp(-x64)), "silu": x64 / (1 + np.exp(-x64)), "relu": np.maximum(x64, 0),
    "erf": _erf(x64), "gelu_exact": 0.5 * x64 * (1 + _erf(x64 / np.sqrt(2))),
    "gelu_tanh": torch.nn.functional.gelu(torch.from_numpy(x64), approximate="tanh").numpy(),
    "softplus": np.log1p(np.exp(x64)), "clip": np.clip(x64, -0.5, 0.5), "abs": np.abs(x64),
    "square": x64 * x64, "leaky_relu": np.where(x64 >= 0, x64, 0.1 * x64), "floor": np.floor(x64 * 3),
}


@pytest.fixture(scope="module")
def elementwise_outputs(tmp_path_factory):
    specs = [mb.TensorSpec(shape=a.shape, dtype=types.fp16) for a in (X, Y, P)]

    @mb.program(input_specs=specs, opset_version=ct.target.iOS18)
    def prog(x, y, p):
        return (
            mb.add(x=x, y=y, name="add"), mb.sub(x=x, y=y, name="sub"), mb.mul(x=x, y=y, name="mul"),
            mb.real_div(x=x, y=p, name="real_div"), mb.maximum(x=x, y=y, name="maximum"),
            mb.minimum(x=x, y=y, name="minimum"), mb.pow(x=p, y=y, name="pow"),
            mb.floor_div(x=x, y=p, name="floor_div"), mb.mod(x=x, y=p, name="mod"), mb.exp(x=x, name="exp"),
            mb.log(x=p, name="log"), mb.sqrt(x=p, name="sqrt"), mb.rsqrt(x=p, epsilon=np.float16(1e-5), name="rsqrt"),
            mb.inverse(x=p, name="inverse"), mb.tanh(x=x, name="tanh"), mb.sigmoid(x=x, name="sigmoid"),
            mb.silu(x=x, name="silu"), mb.relu(x=x, name="relu"), mb.erf(x=x, name="erf"),
            mb.gelu(x=x, mode="EXACT", name="gelu_exact"), mb.gelu(x=x, mode="TANH_APPROXIMATION", name="gelu_tanh"),
            mb.softplus(x=x, name="softplus"), mb.clip(x=x, alpha=np.float16(-0.5), beta=np.float16(0.5), name="clip"),
            mb.abs(x=x, name="abs"), mb.square(x=x, name="square"),
            mb.leaky_relu(x=x, alpha=np.float16(0.1), name="leaky_relu"),
            mb.floor(x=mb.mul(x=x, y=np.float16(3)), name="floor"),
            mb.greater(x=x, y=y, name="greater"), mb.select(cond=mb.less(x=x, y=y), a=x, b=y, name="select"),
            mb.cast(x=x, dtype="fp32", name="to_fp32"), mb.cast(x=mb.mul(x=x, y=np.float16(4)), dtype="int32",
                                                                name="to_int32"),
        )

    interp = load_interpreter(_save(prog, tmp_path_factory.mktemp("elementwise") / "e.mlpackage"))
    return interp.run({"x": X, "y": Y, "p": P}).outputs


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_matches_reference(elementwise_outputs, name):
    got = elementwise_outputs[name]
    assert got.dtype == np.float16  # the program's own dtype
    _close(got, np.broadcast_to(ELEMENTWISE[name], got.shape))


def test_comparisons_casts_and_select(elementwise_outputs):
    out = elementwise_outputs
    # Core ML outputs cannot be bool: ct.convert casts a bool output to fp32 (the interpreter runs that cast too)
    assert out["greater"].dtype == np.float32 and np.array_equal(out["greater"], X > Y)
    assert np.array_equal(out["select"], np.where(X < Y, X, np.broadcast_to(Y, X.shape)))
    assert out["to_fp32"].dtype == np.float32 and np.array_equal(out["to_fp32"], X.astype(np.float32))
    assert out["to_int32"].dtype == np.int32
    assert np.array_equal(out["to_int32"], (X * np.float16(4)).astype(np.float32).astype(np.int32))


# ------------------------------------------------------------------------------------------------- data movement
T = np.arange(2 * 3 * 4 * 5, dtype=np.float16).reshape(2, 3, 4, 5)
IDX = np.array([[2, 0], [1, -1], [0, 3]], dtype=np.int32)  # negative index: counts from the end
ONE_HOT = np.array([[0, 3, 1], [2, 2, 0]], dtype=np.int32)


@pytest.fixture(scope="module")
def tensor_outputs(tmp_path_factory):
    @mb.program(input_specs=[mb.TensorSpec(shape=T.shape, dtype=types.fp16),
                             mb.TensorSpec(shape=IDX.shape, dtype=types.int32)], opset_version=ct.target.iOS18)
    def prog(t, idx):
        half = mb.slice_by_index(x=t, begin=[0, 0, 0, 0], end=[2, 3, 4, 5], name="half_view")
        return (
            mb.reshape(x=t, shape=[0, -1, 5], name="reshape"),
            mb.reshape(x=t, shape=[0, -1], name="reshape_zero_right"),
            mb.expand_dims(x=t, axes=[-2], name="expand_dims"),
            mb.squeeze(x=mb.expand_dims(x=t, axes=[1]), axes=[1], name="squeeze"),
            mb.transpose(x=t, perm=[2, 0, 3, 1], name="transpose"),
            mb.slice_by_index(x=t, begin=[1, 0, 1, 4], end=[2, 3, 4, 0], stride=[1, 2, 1, -2],
                              begin_mask=[False, True, False, False], end_mask=[True, False, False, True],
                              squeeze_mask=[True, False, False, False], name="slice_masks"),
            mb.slice_by_size(x=t, begin=[0, 1, 1, 0], size=[2, -1, 2, 3], name="slice_by_size"),
            mb.concat(values=[t, half], axis=1, name="concat"),
            mb.concat(values=[t, half], axis=2, interleave=True, name="concat_interleave"),
            mb.stack(values=[t, t], axis=1, name="stack"),
            mb.tile(x=t, reps=[1, 2, 1, 3], name="tile"),
            mb.gather(x=t, indices=idx, axis=2, name="gather"),
            mb.gather(x=t, indices=mb.slice_by_index(x=idx, begin=[0, 0], end=[2, 2]), axis=1, batch_dims=1,
                      name="gather_batch"),
            mb.gather_along_axis(x=t, indices=mb.fill(shape=[2, 3, 1, 5], value=np.int32(2)), axis=2,
                                 name="gather_along_axis"),
            mb.band_part(x=t, lower=1, upper=0, name="band_part"),
            mb.pad(x=t, pad=[1, 0, 2, 1], mode="constant", constant_val=np.float16(-1), name="pad"),
            mb.pad(x=t, pad=[0, 0, 1, 2], mode="replicate", name="pad_replicate"),
            mb.cumsum(x=t, axis=3, exclusive=True, name="cumsum"),
            mb.reverse(x=t, axes=[1], name="reverse"),
            mb.one_hot(indices=ONE_HOT, one_hot_vector_size=4, axis=1, name="one_hot"),
            mb.range_1d(start=np.int32(1), end=mb.reduce_sum(x=mb.cast(x=idx, dtype="int32")), step=np.int32(2),
                        name="range_1d"),
            mb.shape(x=t, name="shape"),
            mb.scatter(data=t, indices=np.array([1, 0], np.int32), updates=mb.fill(shape=[2, 2, 4, 5],
                       value=np.float16(1)), axis=1, mode="add", name="scatter_add"),
            *mb.split(x=t, split_sizes=[1, 2], axis=1, name="split"),
            *mb.topk(x=t, k=2, axis=-1, name="topk"),
        )

    interp = load_interpreter(_save(prog, tmp_path_factory.mktemp("tensor") / "t.mlpackage"))
    return interp.run({"t": T, "idx": IDX}).outputs


def test_views_and_slices(tensor_outputs):
    out = tensor_outputs
    # iOS17+ reshape: a 0 copies the input axis it is right-aligned with ([0, -1, 5] → x.shape[1] = 3, and
    # [0, -1] → x.shape[2] = 4), not the axis at the same position (iOS15's rule, which needs len(shape) == rank)
    assert np.array_equal(out["reshape"], T.reshape(3, 8, 5))
    assert np.array_equal(out["reshape_zero_right"], T.reshape(4, 30))
    assert np.array_equal(out["expand_dims"], T[:, :, :, None, :])  # axes=[-2] of the rank-5 output
    assert np.array_equal(out["squeeze"], T)
    assert np.array_equal(out["transpose"], T.transpose(2, 0, 3, 1))
    # begin_mask on axis 1, end_mask on axes 0 and 3, squeeze axis 0 at index 1, stride -2 on the last axis
    assert np.array_equal(out["slice_masks"], T[1, ::2, 1:4, 4::-2])
    assert np.array_equal(out["slice_by_size"], T[0:2, 1:, 1:3, 0:3])


def test_joins_splits_and_tiles(tensor_outputs):
    out = tensor_outputs
    assert np.array_equal(out["concat"], np.concatenate([T, T], axis=1))
    inter = np.empty((2, 3, 8, 5), np.float16)
    inter[:, :, 0::2], inter[:, :, 1::2] = T, T
    assert np.array_equal(out["concat_interleave"], inter)
    assert np.array_equal(out["stack"], np.stack([T, T], axis=1))
    assert np.array_equal(out["tile"], np.tile(T, [1, 2, 1, 3]))
    split = [v for k, v in out.items() if k.startswith("split")]
    assert [s.shape for s in split] == [(2, 1, 4, 5), (2, 2, 4, 5)]
    assert np.array_equal(np.concatenate(split, axis=1), T)


def test_gathers_and_scatters(tensor_outputs):
    out = tensor_outputs
    assert np.array_equal(out["gather"], np.take(T, np.where(IDX < 0, IDX + 4, IDX), axis=2))
    # batch_dims=1: out[b] = take(T[b], idx[b], axis=0) → [2, 2, 4, 5]
    sub = IDX[:2, :2]
    assert np.array_equal(out["gather_batch"], np.stack([T[b][np.where(sub[b] < 0, sub[b] + 3, sub[b])]
                                                         for b in range(2)]))
    assert np.array_equal(out["gather_along_axis"], np.broadcast_to(T[:, :, 2:3, :], (2, 3, 1, 5)))
    want = T.astype(np.float32).copy()
    want[:, [1, 0]] += 1
    assert np.array_equal(out["scatter_add"], want.astype(np.float16))


def test_masks_pads_scans_sorts(tensor_outputs):
    out = tensor_outputs
    m, n = np.arange(4)[:, None], np.arange(5)[None, :]
    assert np.array_equal(out["band_part"], np.where((m - n <= 1) & (n - m <= 0), T, 0))
    assert np.array_equal(out["pad"], np.pad(T, [(0, 0), (0, 0), (1, 0), (2, 1)], constant_values=-1))
    assert np.array_equal(out["pad_replicate"], np.pad(T, [(0, 0), (0, 0), (0, 0), (1, 2)], mode="edge"))
    assert np.array_equal(out["cumsum"], np.concatenate([np.zeros_like(T[..., :1]), np.cumsum(T, 3)[..., :-1]], 3))
    assert np.array_equal(out["reverse"], T[:, ::-1])
    assert np.array_equal(out["one_hot"], np.moveaxis(ONE_HOT[..., None] == np.arange(4), -1, 1))
    assert np.array_equal(out["range_1d"], np.arange(1, int(IDX.sum()), 2))
    assert np.array_equal(out["shape"], [2, 3, 4, 5])
    values, indices = (v for k, v in out.items() if k.startswith("topk"))
    assert np.array_equal(values, -np.sort(-T, axis=-1)[..., :2]) and np.array_equal(indices[0, 0, 0], [4, 3])


# ------------------------------------------------------------------------------------------------- products
A, B, E = _f16(2, 3, 4, 8), _f16(1, 3, 8, 16), _f16(2, 8, 4, 5)
W_BIG = (RNG.standard_normal((600, 256)) * 0.05).astype(np.float16)  # > BLOCK_ELEMS: the blocked fp16 → fp32 path
BIAS = _f16(600)
CX, CW = _f16(1, 4, 7, 7), (RNG.standard_normal((6, 2, 3, 3)) * 0.2).astype(np.float16)
Q, K, V, M = _f16(1, 2, 3, 8), _f16(1, 2, 5, 8), _f16(1, 2, 5, 8), np.triu(np.full((3, 5), -30000.0), 3)


@pytest.fixture(scope="module")
def product_outputs(tmp_path_factory):
    specs = [mb.TensorSpec(shape=a.shape, dtype=types.fp16) for a in (A, B, E, CX, Q, K, V)]

    @mb.program(input_specs=specs, opset_version=ct.target.iOS18)
    def prog(a, b, e, cx, q, k, v):
        flat = mb.reshape(x=a, shape=[24, 8])
        return (
            mb.matmul(x=a, y=b, name="matmul"),  # batch broadcast [2,3] × [1,3]
            mb.matmul(x=b, y=a, transpose_x=True, transpose_y=True, name="matmul_t"),  # [2,3,16,4]
            mb.linear(x=mb.tile(x=flat, reps=[1, 32]), weight=W_BIG, bias=BIAS, name="linear_big"),
            mb.matmul(x=mb.tile(x=flat, reps=[1, 32]), y=W_BIG, transpose_y=True, name="matmul_big"),
            mb.einsum(values=(a, e), equation="nchw,nwhu->nchu", name="einsum"),
            mb.conv(x=cx, weight=CW, groups=2, pad_type="same", dilations=[2, 1], name="conv_same"),
            mb.conv(x=cx, weight=CW, groups=2, pad_type="custom", pad=[1, 0, 2, 1], strides=[2, 3], name="conv_custom"),
            mb.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=M.astype(np.float16), name="sdpa"),
        )

    interp = load_interpreter(_save(prog, tmp_path_factory.mktemp("products") / "p.mlpackage"))
    return interp.run({"a": A, "b": B, "e": E, "cx": CX, "q": Q, "k": K, "v": V}).outputs


def _t(a):
    return torch.from_numpy(np.asarray(a, dtype=np.float64))


def test_matmul_linear_einsum(product_outputs):
    out = product_outputs
    a, b = A.astype(np.float64), B.astype(np.float64)
    _close(out["matmul"], a @ b)
    _close(out["matmul_t"], np.swapaxes(b, -1, -2) @ np.swapaxes(a, -1, -2))
    x = np.tile(a.reshape(24, 8), [1, 32])
    _close(out["linear_big"], x @ W_BIG.astype(np.float64).T + BIAS, atol=2e-3)
    _close(out["matmul_big"], x @ W_BIG.astype(np.float64).T, atol=2e-3)
    _close(out["einsum"], np.einsum("nchw,nwhu->nchu", a, E.astype(np.float64)))


def test_conv_and_attention_match_torch(product_outputs):
    out = product_outputs
    # "same" with dilation (2, 1): total padding (k-1)*d = (4, 2), split evenly
    same = torch.nn.functional.conv2d(torch.nn.functional.pad(_t(CX), (1, 1, 2, 2)), _t(CW), groups=2, dilation=(2, 1))
    _close(out["conv_same"], same.numpy())
    custom = torch.nn.functional.conv2d(torch.nn.functional.pad(_t(CX), (2, 1, 1, 0)), _t(CW), groups=2, stride=(2, 3))
    _close(out["conv_custom"], custom.numpy())
    sdpa = torch.nn.functional.scaled_dot_product_attention(_t(Q), _t(K), _t(V), attn_mask=_t(M.astype(np.float16)))
    _close(out["sdpa"], sdpa.numpy())


# ------------------------------------------------------------------------------------------------- reductions, norms
R = _f16(2, 3, 4, 6)
GAMMA, BETA = _f16(6) + np.float16(1), _f16(6)


@pytest.fixture(scope="module")
def reduce_outputs(tmp_path_factory):
    @mb.program(input_specs=[mb.TensorSpec(shape=R.shape, dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prog(r):
        return (
            mb.reduce_sum(x=r, axes=[1, 3], keep_dims=True, name="reduce_sum"),
            mb.reduce_mean(x=r, axes=[-1], name="reduce_mean"),
            mb.reduce_max(x=r, name="reduce_max"),
            mb.reduce_l2_norm(x=r, axes=[2], name="reduce_l2_norm"),
            mb.reduce_log_sum_exp(x=r, axes=[3], name="reduce_log_sum_exp"),
            mb.reduce_argmax(x=r, axis=2, keep_dims=True, name="reduce_argmax"),
            mb.softmax(x=r, axis=1, name="softmax"),
            mb.layer_norm(x=r, axes=[-1], gamma=GAMMA, beta=BETA, epsilon=np.float16(1e-5), name="layer_norm"),
            mb.layer_norm(x=r, axes=[2, 3], epsilon=np.float16(1e-5), name="layer_norm_2d"),
            mb.instance_norm(x=r, epsilon=np.float16(1e-5), name="instance_norm"),
            mb.l2_norm(x=r, epsilon=np.float16(1e-6), name="l2_norm"),
        )

    interp = load_interpreter(_save(prog, tmp_path_factory.mktemp("reduce") / "r.mlpackage"))
    return interp.run({"r": R}).outputs


def test_reductions_and_norms(reduce_outputs):
    out, r = reduce_outputs, R.astype(np.float64)
    tr = _t(R)
    _close(out["reduce_sum"], r.sum(axis=(1, 3), keepdims=True), atol=5e-3)
    _close(out["reduce_mean"], r.mean(axis=-1))
    _close(out["reduce_max"], r.max())
    _close(out["reduce_l2_norm"], np.sqrt((r * r).sum(axis=2)))
    _close(out["reduce_log_sum_exp"], np.log(np.exp(r).sum(axis=3)))
    assert out["reduce_argmax"].dtype == np.int32 and np.array_equal(out["reduce_argmax"], r.argmax(2)[:, :, None])
    _close(out["softmax"], torch.softmax(tr, 1).numpy())
    _close(out["layer_norm"], torch.nn.functional.layer_norm(tr, (6,), _t(GAMMA), _t(BETA), 1e-5).numpy(), atol=4e-3)
    _close(out["layer_norm_2d"], torch.nn.functional.layer_norm(tr, (4, 6), eps=1e-5).numpy(), atol=4e-3)
    _close(out["instance_norm"], torch.nn.functional.instance_norm(tr, eps=1e-5).numpy(), atol=4e-3)
    _close(out["l2_norm"], (r.reshape(2, -1) / np.sqrt((r.reshape(2, -1) ** 2).sum(1, keepdims=True))).reshape(r.shape))


# ------------------------------------------------------------------------------------------------- states
@pytest.fixture(scope="module")
def cache_package(tmp_path_factory):
    """read_state → slice_update at ``pos`` → write_state → read_state → q·cacheᵀ: a one-layer KV write."""

    @mb.program(input_specs=[mb.StateTensorSpec(shape=(1, 2, 8, 4), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, 2, 1, 4), dtype=types.fp16),
                             mb.TensorSpec(shape=(1,), dtype=types.int32)], opset_version=ct.target.iOS18)
    def prog(k_cache_0, new_k, pos):
        begin = mb.concat(values=[np.array([0, 0], np.int32), pos, np.array([0], np.int32)], axis=0)
        end = mb.add(x=begin, y=np.array([1, 2, 1, 4], np.int32))
        upd = mb.slice_update(x=mb.read_state(input=k_cache_0), update=new_k, begin=begin, end=end)
        mb.coreml_update_state(state=k_cache_0, value=upd)
        return mb.matmul(x=new_k, y=mb.read_state(input=k_cache_0), transpose_y=True, name="scores")

    return _save(prog, tmp_path_factory.mktemp("state") / "s.mlpackage")


def test_states_start_at_zero_and_carry_between_runs(cache_package):
    interp = load_interpreter(cache_package)
    assert [s.name for s in interp.states] == ["k_cache_0"] and [t.name for t in interp.inputs] == ["new_k", "pos"]
    rows = [_f16(1, 2, 1, 4) for _ in range(3)]
    states, want = None, np.zeros((1, 2, 8, 4), np.float16)
    for pos, row in enumerate(rows):
        given = None if states is None else {k: v.copy() for k, v in states.items()}
        result = interp.run({"new_k": row, "pos": np.array([pos])}, states)
        want[:, :, pos] = row[:, :, 0]
        assert np.array_equal(result.states["k_cache_0"], want)
        _close(result.outputs["scores"], row.astype(np.float64) @ np.swapaxes(want, -1, -2).astype(np.float64))
        if given is not None:  # the caller's states are not modified
            assert all(np.array_equal(given[k], states[k]) for k in given)
        states = result.states


# ------------------------------------------------------------------------------------------------- compressed weights
def _constexpr_program(target):
    """Each constexpr output is added to the fp16 input ``x`` [6, 8], so every one reaches an output."""
    i4 = types.np_int4_dtype
    data_i4 = RNG.integers(-8, 8, (6, 8)).astype(i4)
    blocks = {
        "shift_scale_int4": lambda: mb.constexpr_blockwise_shift_scale(
            data=data_i4, scale=_f16(3, 2, positive=True), offset=RNG.integers(-8, 8, (3, 2)).astype(i4)),
        "shift_scale_uint8": lambda: mb.constexpr_blockwise_shift_scale(
            data=RNG.integers(0, 256, (6, 8)).astype(np.uint8), scale=_f16(6, 1, positive=True)),
        "shift_scale_fp16_offset": lambda: mb.constexpr_blockwise_shift_scale(
            data=RNG.integers(-128, 128, (6, 8)).astype(np.int8), scale=_f16(1, 4), offset=_f16(1, 4)),
        "lut_uint3_grouped": lambda: mb.constexpr_lut_to_dense(
            indices=RNG.integers(0, 8, (6, 8)).astype(types.np_uint3_dtype), lut=_f16(2, 1, 8, 1)),
        "lut_vector_axis1": lambda: mb.constexpr_lut_to_dense(
            indices=RNG.integers(0, 4, (6, 4)).astype(types.np_uint2_dtype), lut=_f16(1, 2, 4, 2), vector_axis=1),
        "lut_vector_axis0": lambda: mb.constexpr_lut_to_dense(
            indices=RNG.integers(0, 2, (3, 8)).astype(types.np_uint1_dtype), lut=_f16(3, 1, 2, 2), vector_axis=0),
        "sparse": lambda: mb.constexpr_sparse_to_dense(
            nonzero_data=_f16(20), mask=np.array([1] * 20 + [0] * 28)[RNG.permutation(48)].reshape(6, 8).astype(
                types.np_uint1_dtype)),
    }

    @mb.program(input_specs=[mb.TensorSpec(shape=(6, 8), dtype=types.fp16)], opset_version=target)
    def prog(x):
        return tuple(mb.add(x=x, y=make(), name=name) for name, make in blocks.items())

    return prog


def test_constexpr_ops_decompress_as_coremltools_does(tmp_path):
    prog = _constexpr_program(ct.target.iOS18)
    expected = {op.outputs[0].name: op.materialized_val_inference()
                for op in prog.functions["main"].operations if op.op_type.startswith("constexpr_")}
    adds = {op.name: op.y.op.outputs[0].name for op in prog.functions["main"].operations if op.op_type == "add"}
    interp = load_interpreter(_save(prog, tmp_path / "c.mlpackage"))
    x = _f16(6, 8)
    out = interp.run({"x": x}).outputs
    for add_name, constexpr_name in adds.items():
        dense = expected[constexpr_name]
        assert np.array_equal(interp.constant(constexpr_name), dense.astype(np.float16)), add_name
        _close(out[add_name], x.astype(np.float64) + dense)


def test_ios16_constexpr_forms(tmp_path):
    """iOS16: packed-byte LUT indices with a ``shape``, affine dequantization along an axis, a packed sparse mask."""
    data = RNG.integers(0, 256, (6, 8)).astype(np.uint8)
    lut, idx = _f16(16), RNG.integers(0, 16, 48).astype(np.uint8)
    packed = (idx[0::2] | (idx[1::2] << 4)).astype(np.uint8)  # 4-bit indices, least significant bits first
    mask_bits = RNG.integers(0, 2, 48).astype(np.uint8)
    nonzero = _f16(int(mask_bits.sum()))

    @mb.program(input_specs=[mb.TensorSpec(shape=(6, 8), dtype=types.fp16)], opset_version=ct.target.iOS16)
    def prog(x):
        return (
            mb.add(x=x, y=mb.constexpr_affine_dequantize(quantized_data=data, zero_point=np.uint8(128),
                                                         scale=_f16(6, positive=True), axis=0), name="affine"),
            mb.add(x=x, y=mb.constexpr_lut_to_dense(indices=packed, lut=lut, shape=np.array([6, 8], np.uint32)),
                   name="lut16"),
            mb.add(x=x, y=mb.constexpr_sparse_to_dense(nonzero_data=nonzero, mask=np.packbits(mask_bits,
                   bitorder="little"), shape=np.array([6, 8], np.uint32)), name="sparse16"),
        )

    expected = {op.op_type: op.materialized_val_inference() for op in prog.functions["main"].operations
                if op.op_type.startswith("constexpr_")}
    interp = load_interpreter(_save(prog, tmp_path / "c16.mlpackage", ct.target.iOS16))
    x = np.zeros((6, 8), np.float16)
    out = interp.run({"x": x}).outputs
    assert np.array_equal(out["lut16"], lut[idx].reshape(6, 8))
    assert np.array_equal(out["lut16"], expected["constexpr_lut_to_dense"])
    _close(out["affine"], expected["constexpr_affine_dequantize"])
    dense = np.zeros(48, np.float16)
    dense[mask_bits != 0] = nonzero
    assert np.array_equal(out["sparse16"], dense.reshape(6, 8))


@pytest.fixture(scope="module")
def tiny_mlp(tmp_path_factory):
    """A 2-linear torch MLP converted to an fp16 ML Program (weights large enough for blockwise compression)."""
    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = torch.nn.Linear(64, 96), torch.nn.Linear(96, 32, bias=False)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))

    torch.manual_seed(0)
    traced = torch.jit.trace(MLP().eval(), torch.randn(1, 64))
    return ct.convert(traced, inputs=[ct.TensorType(name="x", shape=(1, 64), dtype=np.float16)],
                      outputs=[ct.TensorType(name="y", dtype=np.float16)], convert_to="mlprogram",
                      minimum_deployment_target=ct.target.iOS18, compute_precision=ct.precision.FLOAT16)


@pytest.mark.parametrize("compress", ["int4_per_block", "int8_per_channel", "pal3_grouped", "pal4_per_tensor",
                                      "prune50", "prune50+pal4", "prune50+int8"])
def test_optimize_coreml_packages_run_as_their_decompressed_twins(tiny_mlp, compress, tmp_path):
    """A package compressed by coremltools.optimize.coreml gives exactly the outputs of the same package after
    coremltools' own ``decompress_weights`` (dense fp16 consts)."""
    import coremltools.optimize.coreml as cto

    def config(op_config):
        return cto.OptimizationConfig(global_config=op_config)

    steps = {
        "int4_per_block": (cto.linear_quantize_weights, cto.OpLinearQuantizerConfig(
            mode="linear", dtype="int4", granularity="per_block", block_size=16, weight_threshold=0)),
        "int8_per_channel": (cto.linear_quantize_weights, cto.OpLinearQuantizerConfig(
            mode="linear_symmetric", weight_threshold=0)),
        "pal3_grouped": (cto.palettize_weights, cto.OpPalettizerConfig(
            mode="uniform", nbits=3, granularity="per_grouped_channel", group_size=16, weight_threshold=0)),
        "pal4_per_tensor": (cto.palettize_weights, cto.OpPalettizerConfig(mode="uniform", nbits=4,
                                                                          weight_threshold=0)),
        "prune50": (cto.prune_weights, cto.OpMagnitudePrunerConfig(target_sparsity=0.5, weight_threshold=0)),
        "int8": (cto.linear_quantize_weights, cto.OpLinearQuantizerConfig(mode="linear", weight_threshold=0)),
        "pal4": (cto.palettize_weights, cto.OpPalettizerConfig(mode="uniform", nbits=4, weight_threshold=0)),
    }
    compressed = tiny_mlp
    for i, name in enumerate(compress.split("+")):  # a second step compresses jointly (sparse + lut / int8)
        optimize, op_config = steps[name]
        kwargs = {"joint_compression": True} if i else {}
        compressed = optimize(compressed, config(op_config), **kwargs)
    compressed.save(str(tmp_path / "c.mlpackage"))
    cto.decompress_weights(compressed).save(str(tmp_path / "d.mlpackage"))
    c, d = load_interpreter(tmp_path / "c.mlpackage"), load_interpreter(tmp_path / "d.mlpackage")
    assert any(t.startswith("constexpr_") for t in c.op_types()) and not any(
        t.startswith("constexpr_") for t in d.op_types())
    x = {"x": _f16(1, 64)}
    assert np.array_equal(c.run(x).outputs["y"], d.run(x).outputs["y"])


# ------------------------------------------------------------------------------------------------- errors and API
def test_unknown_op_is_an_error_naming_type_and_op(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 2, 4, 4), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prog(x):
        return mb.upsample_nearest_neighbor(x=mb.relu(x=x), scale_factor_height=2, scale_factor_width=2,
                                            name="my_upsample")

    assert "upsample_nearest_neighbor" not in supported_op_types()
    with pytest.raises(UnknownOpError, match=r"'my_upsample' has type 'upsample_nearest_neighbor'"):
        load_interpreter(_save(prog, tmp_path / "u.mlpackage"))


def test_bad_inputs_are_one_line_errors_naming_the_input(cache_package):
    interp = load_interpreter(cache_package)
    ok = {"new_k": np.zeros((1, 2, 1, 4)), "pos": np.array([0])}
    with pytest.raises(InterpretError, match=r"input 'pos' \(int32 \[1\]\) is missing"):
        interp.run({"new_k": ok["new_k"]})
    with pytest.raises(InterpretError, match=r"input 'extra' is not among the inputs"):
        interp.run({**ok, "extra": np.zeros(1)})
    with pytest.raises(InterpretError, match=r"'new_k' has shape \[1, 2, 2, 4\]; the program declares \[1,2,1,4\]"):
        interp.run({**ok, "new_k": np.zeros((1, 2, 2, 4))})
    with pytest.raises(InterpretError, match=r"state 'k_cache_0' has shape \[8\]"):
        interp.run(ok, {"k_cache_0": np.zeros(8)})
    # an out-of-range slot is the op's error, named
    with pytest.raises(InterpretError, match=r"op '.*' \(slice_update\) cannot run its operand 'update': is fp16\["
                                             r"1,2,1,4\]: it does not fit the slice"):
        interp.run({**ok, "pos": np.array([9])})
    assert interp.run(ok).outputs["scores"].dtype == np.float16  # float64 inputs were cast to the declared fp16


def test_not_a_package_is_a_mil_error(tmp_path):
    with pytest.raises(MilError, match=r"not an \.mlpackage"):
        load_interpreter(tmp_path)
    broken = tmp_path / "broken.mlpackage"
    broken.mkdir()
    with pytest.raises(MilError):
        load_interpreter(broken)


def test_multifunction_package_runs_the_named_function(tmp_path):
    def single(scale):
        @mb.program(input_specs=[mb.TensorSpec(shape=(2, 3), dtype=types.fp16)], opset_version=ct.target.iOS18)
        def prog(x):
            return mb.mul(x=x, y=np.float16(scale), name="y")

        return _save(prog, tmp_path / f"s{scale}.mlpackage")

    desc = ct.utils.MultiFunctionDescriptor()
    desc.add_function(str(single(2)), src_function_name="main", target_function_name="double")
    desc.add_function(str(single(3)), src_function_name="main", target_function_name="triple")
    desc.default_function_name = "double"
    ct.utils.save_multifunction(desc, str(tmp_path / "multi.mlpackage"))
    x = _f16(2, 3)
    for name, scale in (("double", 2), ("triple", 3)):
        interp = load_interpreter(tmp_path / "multi.mlpackage", function=name)
        assert interp.function == name
        assert np.array_equal(interp.run({"x": x}).outputs["y"], (x * np.float16(scale)))
    with pytest.raises(MilError, match="no function 'quadruple'"):
        load_interpreter(tmp_path / "multi.mlpackage", function="quadruple")


def test_blob_data_is_memory_mapped_and_exact(tmp_path):
    """``Blobs.data`` (analyzer.ir.coreml.mil_reader) returns the stored bytes of a weight as a read-only memory map."""
    from analyzer.ir.coreml.mil_reader import Blobs, load_function

    weight = (RNG.standard_normal((40, 30)) * 3).astype(np.float16)

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 30), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prog(x):
        return mb.linear(x=x, weight=weight, name="y")

    loaded = load_function(_save(prog, tmp_path / "w.mlpackage"))
    const = next(op for op in loaded.block.operations if op.type == "const"
                 and op.attributes["val"].WhichOneof("value") == "blobFileValue")
    blob = const.attributes["val"].blobFileValue
    raw = Blobs(loaded.weights_dir).data(blob.fileName, blob.offset)
    assert isinstance(raw, np.memmap) and not raw.flags.writeable
    assert np.array_equal(raw.view(np.float16).reshape(40, 30), weight)
    interp = load_interpreter(tmp_path / "w.mlpackage")
    assert np.array_equal(interp.constant(const.outputs[0].name), weight)


@pytest.mark.parametrize(("nbits", "signed"), [(1, False), (2, False), (3, False), (4, False), (6, False),
                                               (4, True)])  # int4 is the only signed sub-byte MIL dtype
def test_unpack_bits_matches_coremltools(nbits, signed):
    from coremltools.optimize._utils import pack_elements_into_bits, restore_elements_from_packed_bits
    lo, hi = (-(1 << (nbits - 1)), 1 << (nbits - 1)) if signed else (0, 1 << nbits)
    values = RNG.integers(lo, hi, 37).astype(np.int8 if signed else np.uint8)
    packed = pack_elements_into_bits(values, nbits)
    got = unpack_bits(packed, nbits, values.size, signed)
    assert np.array_equal(got, values)
    assert np.array_equal(got, restore_elements_from_packed_bits(packed, nbits, values.size, signed))


def test_fp32_programs_compute_in_fp32(tmp_path):
    """An fp32 graph stays fp32 end to end: linear + softmax agree with float64 to fp32 precision."""
    w, x = RNG.standard_normal((5, 7)).astype(np.float32), RNG.standard_normal((3, 7)).astype(np.float32)

    @mb.program(input_specs=[mb.TensorSpec(shape=(3, 7), dtype=types.fp32)], opset_version=ct.target.iOS18)
    def prog(x):
        return mb.softmax(x=mb.linear(x=x, weight=w), axis=-1, name="p")

    got = load_interpreter(_save(prog, tmp_path / "f32.mlpackage")).run({"x": x}).outputs["p"]
    logits = x.astype(np.float64) @ w.astype(np.float64).T
    want = np.exp(logits - logits.max(-1, keepdims=True))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want / want.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_activation_quantize_dequantize(tmp_path):
    """iOS17 ``quantize`` → ``dequantize`` (activation quantization): round(x / scale) + zero_point, clipped to
    int8, then back."""
    x, scale = _f16(2, 6), np.float16(0.05)

    @mb.program(input_specs=[mb.TensorSpec(shape=(2, 6), dtype=types.fp16)], opset_version=ct.target.iOS18)
    def prog(x):
        q = mb.quantize(input=x, scale=scale, zero_point=np.int8(3), output_dtype="int8", name="q")
        return mb.dequantize(input=q, scale=scale, zero_point=np.int8(3), name="dq")

    out = load_interpreter(_save(prog, tmp_path / "q.mlpackage")).run({"x": x}).outputs["dq"]
    q = np.clip(np.round(x.astype(np.float32) / np.float32(scale)) + 3, -128, 127)
    _close(out, np.float32(scale) * (q - 3))


def test_fp16_widening_is_the_same_with_numpy_or_torch(monkeypatch):
    """Every fp16 bit pattern widened both ways (ops._common.widen_into: NumPy until a process has widened
    TORCH_AFTER_ELEMENTS or imported torch, then torch's vectorized copy) gives the same fp32 bits; a NaN stays
    a NaN (torch quiets a signalling NaN's payload, NumPy keeps it)."""
    from analyzer.engines.interpret.ops import _common

    src = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    monkeypatch.setattr(_common, "_widened", [0])
    monkeypatch.delitem(sys.modules, "torch")  # a process that has not imported torch
    by_numpy = _common.widen_into(np.empty(src.shape, np.float32), src)
    assert _common._widened == [src.size]  # counted: NumPy did it
    monkeypatch.undo()
    monkeypatch.setattr(_common, "_widened", [_common.TORCH_AFTER_ELEMENTS])
    by_torch = _common.widen_into(np.empty(src.shape, np.float32), src)
    assert _common._widened == [_common.TORCH_AFTER_ELEMENTS]  # not counted: torch did it
    nan = np.isnan(src)
    assert np.array_equal(np.isnan(by_numpy), nan) and np.array_equal(np.isnan(by_torch), nan)
    assert np.array_equal(by_numpy.view(np.uint32)[~nan], by_torch.view(np.uint32)[~nan])
    assert np.array_equal(by_numpy[~nan], src[~nan].astype(np.float64))
