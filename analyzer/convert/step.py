"""A decode or prefill step (``analyzer.model.decode.DecodeStep``, ``analyzer.model.prefill.PrefillStep``) → a
traced TorchScript module → ``ct.convert`` arguments.

One place for what every conversion shares, whether its weights hold values (:func:`convert_step`, which
returns a runnable ``MLModel``) or not (``analyzer.convert.header_blobs``): the Core ML inputs, states and
outputs, the iOS18 target, fp16 compute, and the pass pipeline (without ``common::const_deduplication``
when an untied embedding/lm_head pair must stay two consts, design.md); and, for value-free conversions (the
analysis mode), the same pipeline run per weight tensor instead of per weight element. Every conversion runs
coremltools' pipeline without the work that cannot change its program (``analyzer.convert.quick_passes``).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import numpy as np

from analyzer.convert.quick_passes import quick_passes
from analyzer.model.decode import example_inputs
from analyzer.model.prefill import PrefillStep, example_prefill_inputs


def ct_io(step):
    """Core ML inputs, states and outputs of a decode step (q_len 1) or a prefill step (q_len N: ``input_ids``
    ``[1, N]``, ``causal_mask`` ``[1, 1, N, S]``, or ``[1, 1, N, S + N]`` with the cache as inputs): logits out;
    the KV cache as one state per layer and K/V (``--kv state``) or as inputs with the new K/V as outputs."""
    import coremltools as ct

    g = step.geometry
    n = getattr(step, "q_len", 1)
    cache_shape = (1, g.num_kv_heads, step.ctx, g.head_dim)
    mask_width = step.ctx + (n if n > 1 and step.kv_mode == "input" else 0)
    inputs = [ct.TensorType(name="input_ids", shape=(1, n), dtype=np.int32),
              ct.TensorType(name="current_pos", shape=(1,), dtype=np.int32),
              ct.TensorType(name="causal_mask", shape=(1, 1, n, mask_width), dtype=np.float16)]
    names = [f"{kv}_cache_{i}" for i in range(g.num_layers) for kv in "kv"]
    outputs = [ct.TensorType(name="logits", dtype=np.float16)]
    if step.kv_mode == "state":
        states = [ct.StateType(wrapped_type=ct.TensorType(shape=cache_shape, dtype=np.float16), name=n)
                  for n in names]
        return inputs, states, outputs
    inputs += [ct.TensorType(name=n, shape=cache_shape, dtype=np.float16) for n in names]
    outputs += [ct.TensorType(name="new_k", dtype=np.float16), ct.TensorType(name="new_v", dtype=np.float16)]
    return inputs, [], outputs


def main_pipeline(keep_duplicate_consts: bool = False):
    """coremltools' default pass pipeline, without ``common::const_deduplication`` when asked: an untied
    embedding/lm_head pair would otherwise be merged back into one const (design.md)."""
    import coremltools as ct

    pipeline = ct.PassPipeline.DEFAULT
    if keep_duplicate_consts:
        pipeline.remove_passes(["common::const_deduplication"])
    return pipeline


def convert_kwargs(step, convert_to: str, keep_duplicate_consts: bool = False) -> dict[str, Any]:
    """``ct.convert`` keyword arguments for a decode step: iOS18, fp16 compute, its I/O and states."""
    import coremltools as ct

    inputs, states, outputs = ct_io(step)
    kwargs: dict[str, Any] = dict(inputs=inputs, outputs=outputs, minimum_deployment_target=ct.target.iOS18,
                                  compute_precision=ct.precision.FLOAT16, convert_to=convert_to)
    if states:
        kwargs["states"] = states
    if keep_duplicate_consts:
        kwargs["pass_pipeline"] = main_pipeline(keep_duplicate_consts=True)
    return kwargs


def trace_step(step):
    """``torch.jit.trace`` of one decode or prefill step (the traced module shares the step's parameters and
    buffers), then the slots the traced call wrote emptied again (the example call runs at position 0: slots
    ``0 .. q_len - 1``). Only those: a lazy cache (``DecodeStep(lazy_cache=True)``) stays unwritten, and so out
    of the resident set."""
    import torch


    example = example_prefill_inputs(step) if isinstance(step, PrefillStep) else example_inputs(step)
    with torch.no_grad():
        traced = torch.jit.trace(step, example, check_trace=False)
        for name, buf in traced.named_buffers():
            if "_cache_" in name:
                buf[:, :, 0:getattr(step, "q_len", 1)].zero_()
    return traced


def convert_step(step, keep_duplicate_consts: bool = False):
    """Trace the decode (or prefill) step and convert it to an iOS18 ML Program (fp16 compute). Returns the
    MLModel, whose weights are the torch model's values (a materialised build). coremltools' pipeline runs
    without its read-only bookkeeping (``quick_passes``): the same package in ~half the CPU for a 2-layer model."""
    import coremltools as ct

    reset_op_names()
    with quick_passes():
        return ct.convert(trace_step(step), **convert_kwargs(step, "mlprogram", keep_duplicate_consts))


def reset_op_names() -> None:
    """Clear coremltools' op-name counters, as ``ct.convert`` does after its backend; qfold's conversions call it
    before they start too, so their ops are named as in a fresh process whatever the process built before with
    coremltools' builder (a fold, a test's ``mb.program``): names are part of an analysis."""
    from coremltools.converters.mil.converter import _reset_conversion_state

    _reset_conversion_state()


# ------------------------------------------------------------------------------------------------- value-free
@contextmanager
def one_value_equal():
    """``torch.equal`` answered from one element when both tensors are one value broadcast (every stride 0, the
    same shape and dtype), else as ever. coremltools' TorchScript lowering asserts ``torch.equal(param,
    state_dict[name])`` for every weight it meets (coremltools 9.0 ``frontend/torch/torchscript_utils.py``,
    ``_lower_graph_block``), and torch scans every element even of an aliased float tensor (for NaN): ~4 ns per
    element here, minutes for a 70B model (bench/results/profile_build.json, hot functions of the ``before``
    profile of 4 Llama-3.1-70B layers). Exact for any such pair, not only ours: every
    element is the one stored value, so the tensors are equal iff those values are (NaN unequal, as torch)."""
    import torch

    original = torch.equal

    def equal(a, b):
        if (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.numel() > 1 and a.shape == b.shape
                and a.dtype == b.dtype and a.device == b.device and not any(a.stride()) and not any(b.stride())):
            return original(a[(0,) * a.dim()], b[(0,) * b.dim()])
        return original(a, b)

    torch.equal = equal
    try:
        yield
    finally:
        torch.equal = original


VALUE_FREE_TRANSPOSES = "qfold::reduce_transposes_consts_kept"


def value_free_pipeline(pipeline):
    """``pipeline`` with every ``common::reduce_transposes`` run as ``qfold::reduce_transposes_consts_kept``:
    the same pass, except that its closing re-inference of every op (coremltools 9.0
    ``optimize_repeat_ops.py``, ``_TransposeOptimization.apply_transform``) leaves ``const`` ops as they are.
    A const's type and value follow from its own ``val`` alone, which the pass never changes (it adds and
    removes ops), so re-inferring one changes nothing; but it compares the value with itself element by element
    (``operation.py``, ``np.any(sym_val.val != out_var.sym_val)``), a full-size temporary per weight, in each of
    the pipeline's 3 runs: 29 % of the full-size default's conversion time and most of a 70B model's
    (bench/results/profile_build.json, the ``before`` profiles)."""
    from coremltools.converters.mil.mil.passes.defs.optimize_repeat_ops import reduce_transposes
    from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY, register_pass

    if VALUE_FREE_TRANSPOSES not in PASS_REGISTRY:

        @register_pass(namespace="qfold")
        class reduce_transposes_consts_kept(reduce_transposes):  # the class name is the pass name
            def apply(self, prog):
                consts = [op for f in prog.functions.values() for op in f.operations if op.op_type == "const"]
                for op in consts:  # an instance attribute shadows the method for this pass only
                    op.type_value_inference = _keep
                try:
                    super().apply(prog)
                finally:
                    for op in consts:
                        del op.type_value_inference

    pipeline.passes = [VALUE_FREE_TRANSPOSES if p == "common::reduce_transposes" else p for p in pipeline.passes]
    return pipeline


def _keep(overwrite_output: bool = False) -> None:
    """A const op's re-inference inside ``qfold::reduce_transposes_consts_kept``: nothing to do."""
