"""``analyzer.convert.quick_passes``: coremltools' pipeline without its read-only bookkeeping makes the same
program as plain ``ct.convert``, byte for byte, and still propagates what a compressed weight needs."""

import logging

import coremltools as ct
import numpy as np
import pytest
import torch
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline, PassPipelineManager

from analyzer.convert.quick_passes import quick_passes
from analyzer.convert.step import convert_kwargs, convert_step, reset_op_names, trace_step
from analyzer.model.decode import DecodeStep, build_model
from analyzer.model.sources import DEFAULT_PRESET, resolve_source

from .conftest import TINY_OVERRIDES

pytestmark = pytest.mark.conversion


@pytest.mark.parametrize("variant", ["repeat_kv", "qfold"])
def test_quick_passes_make_the_plain_conversions_program(variant):
    model = build_model(resolve_source(DEFAULT_PRESET, (*TINY_OVERRIDES, "num_hidden_layers=1")), torch.float16)
    step = DecodeStep(model, 64, variant, "state").eval()
    reset_op_names()  # whatever this process built before (plain ct.convert resets only after it converts)
    plain = ct.convert(trace_step(step), **convert_kwargs(step, "mlprogram"))
    with quick_passes():
        quick = ct.convert(trace_step(step), **convert_kwargs(step, "mlprogram"))
    assert quick.get_spec().mlProgram.SerializeToString(deterministic=True) == \
        plain.get_spec().mlProgram.SerializeToString(deterministic=True)
    assert len(plain.get_spec().mlProgram.functions["main"].block_specializations["CoreML8"].operations) > 50


def _compressed_program():
    """A linear whose weight is a ``constexpr_affine_dequantize``: its output may never be replaced by a var
    that does not come from that weight."""
    rng = np.random.default_rng(0)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8), dtype=types.fp32)], opset_version=ct.target.iOS16)
    def prog(x):
        w = mb.constexpr_affine_dequantize(quantized_data=rng.integers(0, 255, (4, 8)).astype(np.uint8),
                                           zero_point=np.uint8(127), scale=np.float32(0.01), axis=0)
        return mb.relu(x=mb.linear(x=x, weight=w))

    return prog


def test_quick_passes_still_propagate_compressed_weights_and_print_at_debug():
    plain, quick = _compressed_program(), _compressed_program()
    PassPipelineManager.apply_pipeline(plain, PassPipeline.DEFAULT)
    with quick_passes():
        PassPipelineManager.apply_pipeline(quick, PassPipeline.DEFAULT)
        assert str(quick).startswith("<Program: text not built")
        logger = logging.getLogger("coremltools")
        level = logger.level
        logger.setLevel(logging.DEBUG)
        try:
            text = str(quick)
        finally:
            logger.setLevel(level)
    assert text == str(quick) and "constexpr_affine_dequantize" in text  # (names differ: counters per program)

    def upstream(prog):
        return [(op.op_type, sorted(v.op.op_type for v in o.nonreplaceable_vars_upstream))
                for op in prog.functions["main"].operations for o in op.outputs]

    assert upstream(quick) == upstream(plain)
    assert {"constexpr_affine_dequantize", "linear", "relu"} <= {t for t, up in upstream(plain) if up}


@pytest.mark.parametrize("compressed", [True, False])
def test_a_block_exit_still_mends_what_coremltools_would(compressed):
    """A stale set is mended at the next block exit, as coremltools does, with or without a ``constexpr_*`` op: a
    linear of a compressed weight whose set was lost gets it back; a var of a plain program given a set loses it."""
    prog = _compressed_program() if compressed else _plain_program()
    block = prog.functions["main"]
    if compressed:
        expect = {o.name: set(o.nonreplaceable_vars_upstream) for op in block.operations for o in op.outputs}
        stale = next(op for op in block.operations if op.op_type == "linear").outputs[0]
        stale.nonreplaceable_vars_upstream = set()
    else:
        expect = {o.name: set() for op in block.operations for o in op.outputs}
        stale = block.operations[-1].outputs[0]
        stale.nonreplaceable_vars_upstream = {block.operations[0].outputs[0]}
    with quick_passes():
        with block:
            pass
    assert {o.name: set(o.nonreplaceable_vars_upstream) for op in block.operations for o in op.outputs} == expect


def _plain_program():
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, 8), dtype=types.fp32)], opset_version=ct.target.iOS16)
    def prog(x):
        return mb.relu(x=mb.linear(x=x, weight=np.ones((4, 8), np.float32)))

    return prog


def test_a_conversion_names_its_ops_as_a_fresh_process_would():
    """Op names are part of an analysis (the analysis-mode identity compares them): coremltools' builder counters,
    moved by anything built in the process before (a fold, ``mb.program``), must not rename a conversion's ops."""
    model = build_model(resolve_source(DEFAULT_PRESET, (*TINY_OVERRIDES, "num_hidden_layers=1")), torch.float16)
    step = DecodeStep(model, 64, "qfold", "state").eval()

    def names(mlmodel) -> list[str]:
        ops = mlmodel.get_spec().mlProgram.functions["main"].block_specializations["CoreML8"].operations
        return [o.outputs[0].name for o in ops if o.outputs]

    first = names(convert_step(step))
    _plain_program()  # the builder's counters move
    assert names(convert_step(step)) == first
