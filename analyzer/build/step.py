"""A decode or prefill step (``analyzer.model.decode.DecodeStep``, ``analyzer.model.prefill.PrefillStep``) → a
traced TorchScript module → ``ct.convert`` arguments.

One place for what every conversion shares, whether its weights hold values (:func:`convert_step`, which
returns a runnable ``MLModel``) or not (``analyzer.build.valuefree``): the Core ML inputs, states and
outputs, the iOS18 target, fp16 compute, and the pass pipeline (without ``common::const_deduplication``
when an untied embedding/lm_head pair must stay two consts, design.md).
"""

from __future__ import annotations

from typing import Any


def ct_io(step):
    """Core ML inputs, states and outputs of a decode step (q_len 1) or a prefill step (q_len N: ``input_ids``
    ``[1, N]``, ``causal_mask`` ``[1, 1, N, S]``, or ``[1, 1, N, S + N]`` with the cache as inputs): logits out;
    the KV cache as one state per layer and K/V (``--kv state``) or as inputs with the new K/V as outputs."""
    import coremltools as ct
    import numpy as np

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

    from analyzer.model.decode import example_inputs
    from analyzer.model.prefill import PrefillStep, example_prefill_inputs

    example = example_prefill_inputs(step) if isinstance(step, PrefillStep) else example_inputs(step)
    with torch.no_grad():
        traced = torch.jit.trace(step, example, check_trace=False)
        for name, buf in traced.named_buffers():
            if "_cache_" in name:
                buf[:, :, 0:getattr(step, "q_len", 1)].zero_()
    return traced


def convert_step(step, keep_duplicate_consts: bool = False):
    """Trace the decode (or prefill) step and convert it to an iOS18 ML Program (fp16 compute). Returns the
    MLModel, whose weights are the torch model's values (a materialised build)."""
    import coremltools as ct

    return ct.convert(trace_step(step), **convert_kwargs(step, "mlprogram", keep_duplicate_consts))
