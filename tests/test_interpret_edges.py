"""Every registered kernel at the edges ``ct.convert``'s shape arithmetic reaches, held against coremltools' own
type inference (issue #37, item 1): a rank-0 case and a zero-size case per op, each built as the op in a
``Function`` (coremltools ``mil/ops/defs`` infers the output type, and its value for constant operands), and the
kernel run on the same operands through the interpreter's own call (``executor.call_kernel``). Where
coremltools infers a type, the kernel's result has that shape (symbolic dimensions aside) and rounds to that dtype;
where coremltools also infers the value of an integer or bool result (shape arithmetic), the values are equal.

A case coremltools refuses is not a case a program can hold, so the table has none: :data:`NO_EDGE_CASE` names
the kernels with neither case, and why. A kernel that cannot run an operand says which op, which operand and why.
"""

from __future__ import annotations

import re

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil.mil import Builder as mb
from coremltools.converters.mil.mil import Function, types
from coremltools.converters.mil.mil.types.symbolic import is_symbolic

from analyzer.engines.interpret import KERNELS
from analyzer.engines.interpret.executor import call_kernel
from analyzer.engines.interpret.registry import Kernel
from analyzer.engines.interpret.values import NP_DTYPES
from analyzer.errors import InterpretError

F16, I32, I16, U16, B = np.float16, np.int32, np.int16, np.uint16, np.bool_


def s(v=1.5, dt=F16) -> np.ndarray:
    """A rank-0 operand."""
    return np.array(v, dt)


def z(*shape, dt=F16) -> np.ndarray:
    """A zero-size operand."""
    return np.zeros(shape, dt)


def v(*values, dt=I32) -> np.ndarray:
    return np.array(values, dt)


UNARY = ("abs", "acos", "asin", "atan", "atanh", "ceil", "cos", "cosh", "exp", "exp2", "floor", "round", "sign",
         "sin", "sinh", "sqrt", "square", "tan", "tanh", "erf", "identity", "relu", "relu6", "sigmoid", "silu",
         "softplus", "softsign", "inverse", "log", "rsqrt", "gelu")
BINARY = ("add", "sub", "mul", "real_div", "floor_div", "pow", "maximum", "minimum", "mod", "equal", "not_equal",
          "less", "less_equal", "greater", "greater_equal")
LOGICAL = ("logical_and", "logical_or", "logical_xor")
REDUCTIONS = ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod", "reduce_l1_norm",
              "reduce_l2_norm", "reduce_sum_square", "reduce_log_sum", "reduce_log_sum_exp")
ALPHA = ("leaky_relu", "elu", "thresholded_relu", "threshold")
ALPHA_BETA = ("clamped_relu", "scaled_tanh", "sigmoid_hard", "linear_activation")

# op → {case: operands}; the opset is iOS18 unless OPSETS says otherwise
CASES: dict[str, dict[str, dict]] = {
    **{op: {"rank0": {"x": s(0.5)}, "zero": {"x": z(0, 3)}} for op in UNARY},
    "logical_not": {"rank0": {"x": s(True, B)}, "zero": {"x": z(0, 3, dt=B)}},
    **{op: {"rank0": {"x": s(1.5), "y": s(2.0)}, "zero": {"x": z(0, 3), "y": z(1, 3)}} for op in BINARY},
    **{op: {"rank0": {"x": s(True, B), "y": s(False, B)}, "zero": {"x": z(0, 3, dt=B), "y": z(1, 3, dt=B)}}
       for op in LOGICAL},
    # shape arithmetic as ct.convert writes it: integer operands
    "int_real_div": {"rank0": {"x": s(5, I32), "y": s(2, I32)}, "zero": {"x": z(0, dt=I32), "y": z(0, dt=I32)},
                     "vector": {"x": v(1, 2, 2, 7, 8), "y": v(1, 2, 1, 7, 8)}},
    "int_equal": {"rank0": {"x": s(-1, I32), "y": s(-1, I32)}, "vector": {"x": v(1, -1, 2), "y": s(-1, I32)}},
    **{op: {"rank0": {"x": s(0.5), "alpha": s(0.1)}, "zero": {"x": z(0, 3), "alpha": s(0.1)}} for op in ALPHA},
    **{op: {"rank0": {"x": s(0.5), "alpha": s(0.5), "beta": s(2.0)}, "zero": {"x": z(0, 3), "alpha": s(0.5),
                                                                              "beta": s(2.0)}} for op in ALPHA_BETA},
    "clip": {"rank0": {"x": s(3.0), "alpha": s(0.0), "beta": s(1.0)},
             "zero": {"x": z(0, 3), "alpha": s(0.0), "beta": s(1.0)}},
    "cast": {"rank0": {"x": s(7, U16), "dtype": "int32"}, "zero": {"x": z(0, 3), "dtype": "int32"},
             "uint16": {"x": v(1, 1, 2, 5), "dtype": "uint16"}, "int16": {"x": v(1, 4, 3), "dtype": "int16"},
             "int16 scalar": {"x": s(9, I16), "dtype": "int32"}},
    "select": {"rank0": {"cond": s(True, B), "a": s(1, I32), "b": s(2, I32)},
               "zero": {"cond": z(0, 3, dt=B), "a": z(0, 3), "b": z(0, 3)},
               "vector": {"cond": v(0, 1, 0, dt=B), "a": v(4, 5, 6), "b": v(7, 8, 9)}},
    "prelu": {"zero": {"x": z(1, 2, 0, 3), "alpha": v(0.1, 0.2, dt=F16)}},
    "softplus_parametric": {"zero": {"x": z(1, 2, 0), "alpha": v(1, 2, dt=F16), "beta": v(1, 1, dt=F16)}},
    **{op: {"rank0": {"x": s(2.0)}, "zero": {"x": z(0, 3), "axes": v(1), "keep_dims": s(False, B)}}
       for op in REDUCTIONS},
    "reduce_argmax": {"zero": {"x": z(0, 3), "axis": s(1, I32)}},
    "reduce_argmin": {"zero": {"x": z(0, 3), "axis": s(1, I32)}},
    "softmax": {"zero": {"x": z(0, 3), "axis": s(-1, I32)}},
    "layer_norm": {"zero": {"x": z(0, 3), "axes": v(-1), "gamma": np.ones(3, F16), "beta": np.zeros(3, F16)}},
    "batch_norm": {"zero": {"x": z(0, 2, 3), "mean": np.zeros(2, F16), "variance": np.ones(2, F16)}},
    "instance_norm": {"zero": {"x": z(1, 2, 0), "gamma": np.ones(2, F16), "beta": np.zeros(2, F16)}},
    "l2_norm": {"zero": {"x": z(1, 0, 3)}},
    "matmul": {"zero": {"x": z(0, 3), "y": np.ones((3, 4), F16)}, "empty inner": {"x": z(2, 0), "y": z(0, 4)}},
    "linear": {"zero": {"x": z(0, 3), "weight": np.ones((4, 3), F16), "bias": np.zeros(4, F16)}},
    "einsum": {"zero": {"values": (z(1, 0, 2, 3), np.ones((1, 3, 1, 4), F16)), "equation": "nchw,nwhu->nchu"}},
    "conv": {"zero": {"x": z(0, 2, 4), "weight": np.ones((3, 2, 1), F16)}},
    "scaled_dot_product_attention": {"zero": {"query": z(1, 0, 4), "key": np.ones((1, 3, 4), F16),
                                              "value": np.ones((1, 3, 4), F16)}},
    "reshape": {"rank0": {"x": s(1.0), "shape": v(1, 1)}, "zero": {"x": z(1, 0, 3), "shape": v(0, 3)},
                "to rank0": {"x": v(4, dt=F16), "shape": z(0, dt=I32)}},
    "expand_dims": {"rank0": {"x": s(3, I32), "axes": v(0)}, "zero": {"x": z(0, 3), "axes": v(-1)}},
    "squeeze": {"zero": {"x": z(0, 1, 3), "axes": v(1)}, "to rank0": {"x": v(5), "axes": v(0)}},
    "transpose": {"zero": {"x": z(0, 3), "perm": v(1, 0)}},
    "flatten2d": {"zero": {"x": z(0, 3, 2), "axis": s(1, I32)}},
    "reverse": {"zero": {"x": z(0, 3), "axes": v(0)}},
    "slice_by_index": {"zero": {"x": z(0, 3), "begin": v(0, 0), "end": v(0, 2)},
                       "to rank0": {"x": v(1, 2, 3), "begin": v(1), "end": v(2), "squeeze_mask": v(1, dt=B)}},
    "slice_by_size": {"zero": {"x": z(0, 3), "begin": v(0, 1), "size": v(-1, 2)}},
    "slice_update": {"zero": {"x": z(0, 3), "update": z(0, 2), "begin": v(0, 0), "end": v(0, 2)}},
    "sliding_windows": {"zero": {"x": z(0, 5), "axis": s(1, I32), "size": s(2, I32)}},
    "gather": {"rank0": {"x": v(1, 2, 16, 8, dt=I16), "indices": s(2, I32), "axis": s(0, I32)},
               "zero": {"x": np.ones((4, 3), F16), "indices": z(0, dt=I32), "axis": s(0, I32)},
               "uint16 scalar": {"x": v(1, 7, dt=U16), "indices": s(1, I32), "axis": s(0, I32)}},
    "gather_along_axis": {"zero": {"x": z(0, 3), "indices": z(0, 3, dt=I32), "axis": s(0, I32)}},
    "gather_nd": {"zero": {"x": np.ones((4, 3), F16), "indices": z(0, 1, dt=I32)}},
    "scatter": {"zero": {"data": np.ones((4, 3), F16), "indices": z(0, dt=I32), "updates": z(0, 3)}},
    "scatter_along_axis": {"zero": {"data": z(0, 3), "indices": z(0, 3, dt=I32), "updates": z(0, 3)}},
    "scatter_nd": {"zero": {"data": np.ones((4, 3), F16), "indices": z(0, 1, dt=I32), "updates": z(0, 3)}},
    "concat": {"rank0": {"values": (s(1, I32), s(2, I32), v(3)[0], s(8, I32)), "axis": s(0, I32)},
               "zero": {"values": (z(0, 3), z(0, 3)), "axis": s(0, I32)},
               "zero part": {"values": (z(2, 0), np.ones((2, 3), F16)), "axis": s(1, I32)}},
    "stack": {"rank0": {"values": (s(1, I32), s(2, I32)), "axis": s(0, I32)},
              "zero": {"values": (z(0, 3), z(0, 3)), "axis": s(0, I32)}},
    "split": {"zero": {"x": z(0, 4), "axis": s(1, I32), "num_splits": s(2, I32)}},
    "tile": {"zero": {"x": z(0, 3), "reps": v(2, 1)},
             "computed reps": {"x": z(1, 2, 1, 0, 8), "reps": v(1, 1, 2, 1, 1)}},
    "band_part": {"zero": {"x": z(0, 3)}},
    "fill": {"zero": {"shape": v(0, 3), "value": s(1.0)}, "rank0 shape": {"shape": z(0, dt=I32), "value": s(2.0)}},
    "fill_like": {"rank0": {"ref_tensor": s(1.0), "value": s(2.0)}, "zero": {"ref_tensor": z(0, 3), "value": s(1.0)}},
    "range_1d": {"zero": {"end": s(0, I32), "start": s(0, I32), "step": s(1, I32)}},
    "shape": {"rank0": {"x": s(1.0)}, "zero": {"x": z(0, 3)}},
    "one_hot": {"rank0": {"indices": s(2, I32), "one_hot_vector_size": s(4, I32)},
                "zero": {"indices": z(0, dt=I32), "one_hot_vector_size": s(4, I32)}},
    "pad": {"zero": {"x": z(0, 3), "pad": v(1, 1)}},
    "cumsum": {"zero": {"x": z(0, 3), "axis": s(1, I32)}},
    "argsort": {"zero": {"x": z(0, 3)}},
    "topk": {"zero": {"x": z(0, 3), "k": s(2, I32)}},
    "non_zero": {"zero": {"x": z(0, 3)}},
    "dequantize": {"zero": {"input": z(0, 3, dt=np.int8), "scale": s(0.5)}},
    "quantize": {"zero": {"input": z(0, 3), "scale": s(0.5), "output_dtype": "int8"}},
    "constexpr_cast": {"rank0": {"source_val": s(1.0), "output_dtype": "fp32"},
                       "zero": {"source_val": z(0, 3), "output_dtype": "fp32"}},
}
# Each case's op: "int_real_div" is real_div on integers, and so on.
OP_OF = {"int_real_div": "real_div", "int_equal": "equal"}
OPSETS = {"constexpr_cast": ct.target.iOS16, "dequantize": ct.target.iOS17, "quantize": ct.target.iOS17}
# Kernels with neither case, and why (each is run at these edges only through a program of its own).
NO_EDGE_CASE = {
    "read_state": "reads a state: its operand is a program's state, not a value",
    "write_state": "writes a state: its operand is a program's state, not a value",
    "constexpr_affine_dequantize": "a compressed weight: coremltools requires stored data of rank ≥ 1 with a size",
    "constexpr_blockwise_shift_scale": "a compressed weight: blocks of a stored tensor of rank ≥ 1",
    "constexpr_lut_to_dense": "a compressed weight: a palette and indices of rank ≥ 1",
    "constexpr_lut_to_sparse": "a compressed weight: a palette and a mask of rank ≥ 1",
    "constexpr_sparse_to_dense": "a compressed weight: a mask of rank ≥ 1",
    "constexpr_sparse_blockwise_shift_scale": "a compressed weight: a mask and blocks of rank ≥ 1",
}
ALL = [(name, case) for name, cases in CASES.items() for case in cases]


# Operands that carry data (not parameters coremltools requires to be constant)
DATA = frozenset({"x", "y", "a", "b", "cond", "input", "query", "key", "value", "data", "updates", "ref_tensor"})


def _infer(op: str, operands: dict, opset) -> list:
    """The op's output vars: built on constant operands (type and value inference), or where a data operand is
    zero-size, on placeholders of the data operands (type inference alone, as for the op in a program: coremltools'
    own value inference cannot run some zero-size operands, e.g. NumPy's ``vectorize``)."""
    # a rank-0 integer parameter (axis, k, keep_dims) as the Python scalar coremltools' builders take
    operands = {k: a.item() if isinstance(a, np.ndarray) and a.ndim == 0 and a.dtype.kind in "iub" and k not in DATA
                else a for k, a in operands.items()}
    data = {k: a for k, a in operands.items() if k in DATA and isinstance(a, np.ndarray) and a.size == 0}
    holders = {k: mb.placeholder(shape=a.shape, dtype=types.numpy_type_to_builtin_type(a.dtype))
               for k, a in data.items()}
    values = operands.get("values")
    if isinstance(values, tuple) and any(a.size == 0 for a in values):
        holders.update({f"values{i}": mb.placeholder(shape=a.shape, dtype=types.numpy_type_to_builtin_type(a.dtype))
                        for i, a in enumerate(values)})
    with Function(holders, opset_version=opset) as f:
        given = {**operands, **{k: f.inputs[k] for k in data}}
        if "values0" in holders:
            given["values"] = tuple(f.inputs[f"values{i}"] for i in range(len(values)))
        out = getattr(mb, op)(**given)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _np_dtype(builtin) -> np.dtype:
    return NP_DTYPES[types.builtin_to_string(builtin)]


def test_every_kernel_has_an_edge_case_or_a_reason():
    covered = {OP_OF.get(name, name) for name in CASES}
    assert set(KERNELS) == covered | set(NO_EDGE_CASE), (sorted(set(KERNELS) - covered - set(NO_EDGE_CASE)),
                                                         sorted((covered | set(NO_EDGE_CASE)) - set(KERNELS)))
    assert not covered & set(NO_EDGE_CASE)


@pytest.mark.parametrize(("name", "case"), ALL, ids=[f"{n}-{c}" for n, c in ALL])
def test_kernel_matches_coremltools_type_inference(name, case):
    op, operands = OP_OF.get(name, name), CASES[name][case]
    outs = _infer(op, operands, OPSETS.get(op, ct.target.iOS18))  # coremltools refusing the case is a table bug
    got = call_kernel(KERNELS[op], f"{op}_case", dict(operands))
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(outs)
    for mil, value in zip(outs, got, strict=True):
        value = np.asarray(value)
        want_shape = tuple(mil.shape)
        assert value.ndim == len(want_shape), (op, case, value.shape, want_shape)
        assert all(is_symbolic(w) or int(w) == g for w, g in zip(want_shape, value.shape, strict=True)), \
            (op, case, value.shape, want_shape)
        target = _np_dtype(mil.dtype)
        rounded = value.astype(target)  # what the interpreter does with every result (executor._conform)
        if mil.val is not None and target.kind in "iub":
            np.testing.assert_array_equal(rounded, np.asarray(mil.val).astype(target), err_msg=f"{op} {case}")


# ------------------------------------------------------------------------------------------------ errors
ERRORS = [
    ("concat", {"values": (s(1, I32), v(2, 3)), "axis": s(0, I32)}, r"operand 'values\[1\]': is int32\[2\], not of "
                                                                     r"the rank of values\[0\] \(int32\[\]\)"),
    ("concat", {"values": (v(1, 2),), "axis": s(1, I32)}, r"operand 'values\[0\]': is int32\[2\] \(rank 1\): it has no "
                                                          r"axis 1"),
    ("concat", {"values": (z(2, 3), z(3, 4)), "axis": s(0, I32)}, r"operand 'values\[1\]': is fp16\[3,4\]: its sizes "
                                                                  r"off axis 0 differ"),
    ("gather", {"x": s(3, I32), "indices": s(0, I32), "axis": s(0, I32)}, r"operand 'x': is int32\[\] \(rank 0\): it "
                                                                          r"has no axis 0"),
    ("softmax", {"x": z(2, 3), "axis": s(2, I32)}, r"operand 'x': is fp16\[2,3\] \(rank 2\): it has no axis 2"),
    ("slice_update", {"x": z(2, 3), "update": z(1, 3), "begin": v(0, 0), "end": v(2, 3)},
     r"operand 'update': is fp16\[1,3\]: it does not fit the slice of shape \[2, 3\]"),
]


@pytest.mark.parametrize(("op", "operands", "message"), ERRORS, ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)])
def test_a_kernel_that_cannot_run_an_operand_names_op_operand_and_why(op, operands, message):
    with pytest.raises(InterpretError) as info:
        call_kernel(KERNELS[op], "bad_op", operands)
    text = str(info.value)
    assert text.startswith(f"op 'bad_op' ({op}) cannot run its operand"), text
    assert re.search(message, text), text
    assert not re.search(r"\b[A-Z]\w*Error\b", text), f"a Python exception's name leaks: {text}"


def test_an_unexpected_kernel_failure_is_told_in_words():
    """A failure with no message of its own (ZeroDivisionError, IndexError) is told by what it means, the op and its
    operands named: the message issue #37 saw ("ZeroDivisionError: integer modulo by zero") cannot come back."""
    def boom(values, axis):
        return values[0].ndim % 0  # the old concat's failure on rank-0 values

    with pytest.raises(InterpretError) as info:
        call_kernel(Kernel("concat", boom, frozenset({"values"}), True), "concat_11", {"values": (s(1, I32),),
                                                                                      "axis": s(0, I32)})
    text = str(info.value)
    assert text == "op 'concat_11' (concat) cannot run on its operands (values: int32[], axis: int32[]): integer " \
                   "modulo by zero", text
