"""Core AI builds (``--backend coreai``) inside the conversion child (``analyzer.convert.child``).

The same torch step as a Core ML build (``analyzer.model.decode.DecodeStep`` or the prefill step, the same
variants and KV modes) goes through ``torch.export`` instead of ``torch.jit.trace``; the step's cache write takes
an export-friendly form only while exporting (``BufferLayer.update``), so Core ML traces are unchanged. Then
(coreai-torch 0.4.3, ../shared/probe/coreai/RESULTS.md Q2)::

    ep = torch.export.export(step, example).run_decompositions(coreai_torch.get_decomp_table())
    TorchConverter().add_exported_program(ep, input_names=..., output_names=..., state_names=...).to_coreai()
    → save_asset(.tmp-<pid>-model.aimodel) → renamed to model.aimodel

Inputs, outputs and states are named as in a Core ML build (``input_ids``, ``current_pos``, ``causal_mask``,
``k_cache_<i>``/``v_cache_<i>``, ``logits``, ``new_k``/``new_v``): KV as state becomes Core AI state handles
(``read_handle → slice_update → write_handle``), KV as inputs plain inputs. The saved asset is walked by
``analyzer.ir.coreai.walk`` like any other. Two layouts differ from the Core ML build, for every variant alike:
linear weights are stored ``[in, out]`` (``analyzer.model.linear_layout``: no transpose of a constant on every
call), and an fp32 build keeps its KV cache in fp32 (``BuildSpec.kv_dtype``; a Core ML state must be fp16).

Build modes (``--weights fp16`` or ``fp32`` either way):

* ``materialised`` (a Core AI build's default: Core AI's runtime runs on Linux, so its asset is made to be run and
  timed): seeded random or safetensors weights, ``model.aimodel`` kept;
* ``analysis``: the model's weights are fp16 zero-stride views of one constant per tensor
  (``analyzer.model.valuefree``, as for Core ML); coreai-torch stores each as a splat constant, so the asset is a
  few hundred KB whatever the model, and the conversion needs a fraction of the memory
  (bench/results/coreai_valuefree.json). The asset is walked from a temporary folder and not kept: its values
  are not the model's.

With ``--compression SPEC`` (materialised only, ``analyzer.model.backends``) the converted program is compressed
with coreai-opt before it is saved (``analyzer.convert.compress.coreai_apply``), a tied embedding first untied in
torch when the spec gives embed and lm_head different schemes, as for Core ML.
"""

from __future__ import annotations

import gc
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

from analyzer.analysis.program_json import program_from_json, program_to_json
from analyzer.analysis.record import SCHEMA_VERSION
from analyzer.convert.compress.coreai_apply import compress_coreai_program
from analyzer.convert.coreai_quick import one_value_converter
from analyzer.convert.launch import ASSET_NAME
from analyzer.convert.modes import (
    _analyses,
    _describe,
    _plan,
    _torch_checks,
    _untie_if_needed,
    analysis_workers,
    make_step,
)
from analyzer.convert.progress import Clock, emit, peak_rss_bytes
from analyzer.ir.coreai.walk import read_asset
from analyzer.jsonfields import Field
from analyzer.model.backends import TORCH_DTYPES, require_coreai
from analyzer.model.decode import build_model, example_inputs
from analyzer.model.linear_layout import pretranspose_linears_
from analyzer.model.prefill import PrefillStep, example_prefill_inputs
from analyzer.model.sources import geometry_of, load_config
from analyzer.model.spec import ANALYSIS_MODE, BuildSpec, phases_of
from analyzer.model.valuefree import assign_value_free_weights_, build_value_free_model


def io_names(step) -> tuple[list[str], list[str]]:
    """(input names, output names) of a step, as its Core ML build names them (``analyzer.convert.step.ct_io``)."""
    g = step.geometry
    caches = [f"{kv}_cache_{i}" for i in range(g.num_layers) for kv in "kv"]
    inputs = ["input_ids", "current_pos", "causal_mask"]
    if step.kv_mode == "input":
        return inputs + caches, ["logits", "new_k", "new_v"]
    return inputs, ["logits"]


def export_only(step):
    """``torch.export`` of a decode or prefill step at position 0; the cache slots the export's own run wrote
    (0 .. q_len - 1) are emptied again, as ``analyzer.convert.step.trace_step`` does."""
    import torch

    example = example_prefill_inputs(step) if isinstance(step, PrefillStep) else example_inputs(step)
    with torch.no_grad():
        ep = torch.export.export(step, example)
        for name, buf in step.named_buffers():
            if "_cache_" in name:
                buf[:, :, 0:getattr(step, "q_len", 1)].zero_()
    return ep


def decompose(ep):
    """The export decomposed for coreai-torch (``run_decompositions(coreai_torch.get_decomp_table())``)."""
    from coreai_torch import get_decomp_table

    return ep.run_decompositions(get_decomp_table())


def export_step(step):
    """``torch.export`` of a step, decomposed for coreai-torch (:func:`export_only`, :func:`decompose`)."""
    return decompose(export_only(step))


def to_program(ep, step, converter=None):
    """The decomposed export as a Core AI program (``AIProgram``), with qfold's input, output and state names.
    ``converter``: a ``TorchConverter`` class (``analyzer.convert.coreai_quick``), coreai-torch's own by default."""
    from coreai_torch import TorchConverter

    sig = ep.graph_signature
    # one name per mutated buffer, in the program's input order (k_cache_0, v_cache_0, k_cache_1, ...)
    states = [s.target for s in sig.input_specs if s.kind.name == "BUFFER" and s.target in
              sig.buffers_to_mutate.values()]
    inputs, outputs = io_names(step)
    return (converter or TorchConverter)().add_exported_program(ep, input_names=inputs, output_names=outputs,
                                                                state_names=states).to_coreai()


def save_asset(program, target: Path) -> None:
    """Save under a temporary ``.aimodel`` name beside ``target`` and rename it into place (``save_asset`` wants
    the suffix)."""
    tmp = target.with_name(f".tmp-{os.getpid()}-{target.name}")
    try:
        program.save_asset(tmp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def model_for(spec: BuildSpec, plan=None):
    """The torch model a Core AI build of ``spec`` exports, linear weights stored ``[in, out]``
    (``analyzer.model.linear_layout``: why): value-free (analysis mode: fp16 views of one constant per tensor,
    assigned before export, which keeps them) or with seeded random or safetensors weights in ``spec.weights``, a
    tied embedding untied first when the compression ``plan`` gives lm_head its own precision. Returns (model,
    whether it was untied)."""
    import torch

    if spec.build_mode == ANALYSIS_MODE:  # check_backend refuses compression in analysis mode
        model = build_value_free_model(spec.source)
        assign_value_free_weights_(model)
        pretranspose_linears_(model, materialise=False)
        return model, False
    model = build_model(spec.source, getattr(torch, TORCH_DTYPES[spec.weights]))
    untied = _untie_if_needed(model, plan, copy_values=True)  # before the layout: lm_head gets its own
    pretranspose_linears_(model)
    return model, untied


def convert_build(spec: BuildSpec, model, converter, clock: Clock, say=None):
    """The Core AI program of ``spec`` from ``model``: export → coreai-torch. ``say(fraction_of_build, stage,
    message)`` reports; a worker process passes none."""
    say = say or (lambda *_: None)
    (phase,) = phases_of(spec.phase)  # check_backend refuses decode+prefill
    step = make_step(model, spec, phase, lazy_cache=spec.build_mode == ANALYSIS_MODE)
    say(0.1, "convert", f"exporting the {phase} step of {spec.variant} (KV as {spec.kv_mode}, ctx {spec.ctx}) "
        "with torch.export")
    ep = clock("export_s", export_step, step)
    say(0.4, "convert", "converting to Core AI (coreai-torch TorchConverter)")
    program = clock("convert_s", to_program, ep, step, converter)
    del ep, step
    return program


def save_and_walk(spec: BuildSpec, program, asset: Path, clock: Clock, say=None):
    """Save ``program`` at ``asset`` and walk it; a value-free asset is removed once walked (its values are not the
    model's)."""
    say = say or (lambda *_: None)
    value_free = spec.build_mode == ANALYSIS_MODE
    say(0.6, "save", f"saving {ASSET_NAME}" + (" (value-free: walked, then removed)" if value_free else ""))
    clock("save_s", save_asset, program, asset)
    del program
    gc.collect()
    say(0.8, "walk", f"walking the saved {ASSET_NAME}")
    walked = replace(clock("walk_s", read_asset, asset), path=ASSET_NAME)
    if value_free:
        shutil.rmtree(asset)
    return walked


def value_free_asset(out_dir: Path) -> Path:
    return out_dir / f".value-free-{ASSET_NAME}"


def coreai_value_free_job(spec_json: dict, out_dir: str) -> dict:
    """A value-free Core AI build in a worker process beside the build child (``progress.worker_pool``): its own
    value-free model, converted, saved and walked; the program as ``program_json``, the timings and the worker's
    peak RSS."""
    import coreai.authoring  # noqa: F401  (before coreai._compiler.dialects)
    import torch

    torch.set_num_threads(1)  # the build child converts on the other core
    spec, clock = BuildSpec.from_json(spec_json), Clock()
    model, _ = clock("build_model_s", model_for, spec)
    program = convert_build(spec, model, one_value_converter(), clock)
    del model
    walked = save_and_walk(spec, program, value_free_asset(Path(out_dir)), clock)
    return {"program": program_to_json(walked), "timings_s": clock.timings, "peak_rss_bytes": peak_rss_bytes()}


class _CoreAIWorkers:
    """The value-free builds of a group after the first, converted in the child's worker processes
    (``progress.SharedWorkers``, planned by ``child.build_all`` with ``modes.analysis_workers``: one per spare core,
    none for models of the reduced model's size), as ``analyzer.convert.modes`` does for Core ML. The pool forks at
    the first submit, before this process makes its own MLIR context."""

    def __init__(self, group: list[BuildSpec], out_dirs, workers):
        self.futures = {s.key: workers.submit(coreai_value_free_job, s.to_json(), str(out_dirs[s.key]))
                        for s in group[1:]} if workers is not None and analysis_workers(group) else {}

    def result(self, spec: BuildSpec):
        """(walked program, timings, the worker's peak RSS), or None when ``spec`` is converted here."""
        if spec.key not in self.futures:
            return None
        t = time.monotonic()
        doc = self.futures.pop(spec.key).result()
        program = program_from_json(Field(doc["program"], f"worker's {spec.variant} program"), SCHEMA_VERSION)
        return program, {**doc["timings_s"], "worker_wait_s": round(time.monotonic() - t, 3)}, doc["peak_rss_bytes"]

    def close(self) -> None:
        for future in self.futures.values():
            future.cancel()


def coreai_group(group: list[BuildSpec], out_dirs, equivalences, done: int, total: int):
    """Core AI builds of one source, weight dtype and build mode: per build, export → convert → save → walk.

    Memory (bench/results/coreai.json, full-size fp16): the torch model (2.6 GB), the converted program's own copy
    of the weights (2.5 GB) and ``save_asset``'s read of the whole saved bytecode to hash it (2.6 GB) peaked at
    8.6 GB when the model lived through the save. A materialised model therefore goes once its program exists and
    is built again (seeded: the same weights) for the group's next build. Value-free builds after the first are
    converted at the same time in worker processes (:class:`_CoreAIWorkers`), each with its own value-free model."""
    require_coreai(compression=any(s.compression for s in group))
    value_free = group[0].build_mode == ANALYSIS_MODE
    workers = _CoreAIWorkers(group, out_dirs, equivalences.workers) if value_free else None  # before any MLIR
    import coreai.authoring  # noqa: F401  (before coreai._compiler.dialects: the other order is a circular import)

    src, weights = group[0].source, group[0].weights
    geometry = geometry_of(load_config(src))
    shared = Clock()
    model = None
    converter = one_value_converter()  # analyzer.convert.coreai_quick: the same asset, no weight materialised
    if workers is not None and workers.futures:
        emit((done + 0.01) / total, "convert", f"converting {', '.join(s.variant for s in group[1:])} in "
             f"{len(workers.futures)} worker process(es) beside this one")
    if value_free:  # fp16 views of one constant per tensor, assigned before export (the export keeps them)
        emit(0.02, "model", _describe(src, geometry, "value-free weights: shapes and dtypes, no values"))
        model, _ = shared("build_model_s", model_for, group[0])
    else:
        kind = "safetensors weights" if src.has_real_weights else f"seeded random weights, seed {src.seed}"
        emit(0.02, "model", _describe(src, geometry, f"{kind}, {weights}"))
    together = [s.key for s in group]
    try:
        for i, spec in enumerate(group):
            def say(fraction, stage, message, base=(done + i) / total):
                emit(base + fraction / total, stage, message)

            clock = Clock()
            plan = _plan(spec, geometry.num_layers)  # check_backend refuses compression in analysis mode
            untied = False
            from_worker = workers.result(spec) if workers is not None else None
            if from_worker is not None:
                walked, timings, peak = from_worker
            else:
                if model is None:
                    model, untied = clock("build_model_s", model_for, spec, plan)
                asset = value_free_asset(out_dirs[spec.key]) if value_free else out_dirs[spec.key] / ASSET_NAME
                program = convert_build(spec, model, converter, clock, say)
                if plan is not None:
                    say(0.5, "compress", f"compressing weights with coreai-opt: {spec.compression}")
                    clock("compress_s", compress_coreai_program, program, plan)
                if not value_free:  # the program holds its own copy of the weights: the torch copy goes before the save
                    model = None
                    gc.collect()
                walked = save_and_walk(spec, program, asset, clock, say)
                del program
                timings, peak = {**shared.timings, **clock.timings}, peak_rss_bytes()
            (phase,) = phases_of(spec.phase)
            checks = clock("equivalence_wait_s", _torch_checks, spec, equivalences, [phase])
            timings = {**timings, **clock.timings}
            extra = {"converted_in_worker": True} if from_worker is not None else {}
            yield spec, _analyses(spec, geometry, [walked], timings, equivalences, checks, untied, together,
                                  None if value_free else out_dirs[spec.key] / ASSET_NAME, peak, extra)
    finally:
        if workers is not None:
            workers.close()
