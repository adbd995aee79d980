"""How each build mode makes a build's analyses (``analyzer.model.spec.BUILD_MODES``), inside the conversion
child (``analyzer.convert.child``):

* ``analysis``: one value-free model per build; every phase traced while the weights are zero pages, then
  converted to a ``milinternal`` program, compressed value-free if asked, and walked from a header-only skeleton
  (``analyzer.convert.header_blobs``); the builds of a group after the first in worker processes beside the child,
  at the same time. No package; the interpreter check is recorded as not run.
* ``materialised``: one fp16 model per source; per build and phase ``ct.convert``, optional compression, save
  (phases merged into one multi-function package), walk, and the decode function in the MIL interpreter
  against torch.

Both record the variants' torch equivalence checked on a reduced model (``analyzer.convert.checks``).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyzer import quiet_coremltools
from analyzer.analysis.buildinfo import BuildInfo
from analyzer.analysis.program_json import program_from_json, program_to_json
from analyzer.analysis.record import SCHEMA_VERSION, Analysis
from analyzer.convert.checks import (
    ReducedEquivalences,
    interpreter_check,
    interpreter_fits,
    interpreter_not_run,
    interpreter_reference,
    is_reduced_size,
    reduced_weights_text,
    torch_check,
)
from analyzer.convert.compress import compress_model, needs_untie, parse_spec
from analyzer.convert.header_blobs import compress_program, to_program, walk_program
from analyzer.convert.launch import PACKAGE_NAME
from analyzer.convert.progress import Clock, SharedWorkers, emit, peak_rss_bytes
from analyzer.convert.step import convert_step, trace_step
from analyzer.ir.coreml.mil_reader import list_functions, read_program
from analyzer.jsonfields import Field
from analyzer.model.backends import COREAI, TORCH_DTYPES, coreai_versions
from analyzer.model.decode import DecodeStep, build_model, untie_embeddings_
from analyzer.model.prefill import PrefillStep
from analyzer.model.sources import geometry_of, load_config
from analyzer.model.spec import BuildSpec, phases_of, tool_versions
from analyzer.model.valuefree import (
    ZeroPageProducts,
    assign_value_free_caches_,
    assign_value_free_weights_,
    build_value_free_model,
)


def make_step(model, spec: BuildSpec, phase: str, lazy_cache: bool = False):
    """The torch step one function of ``spec`` converts: a decode step, or a prefill step of ``spec.q_len``
    (``lazy_cache``: KV buffers resident only where written, for value-free traces)."""

    import torch

    cache_dtype = getattr(torch, TORCH_DTYPES[spec.kv_dtype])
    if phase == "prefill":
        return PrefillStep(model, spec.ctx, spec.variant, spec.kv_mode, spec.q_len, cache_dtype=cache_dtype,
                           lazy_cache=lazy_cache).eval()
    return DecodeStep(model, spec.ctx, spec.variant, spec.kv_mode, cache_dtype=cache_dtype,
                      lazy_cache=lazy_cache).eval()


def save_functions(parts: list[tuple[str, Path]], pkg: Path, default: str) -> None:
    """Merge single-function packages into one multi-function package (``coremltools.utils.MultiFunctionDescriptor``
    + ``save_multifunction``, coremltools 9.0, iOS18): function ``name`` is the ``main`` of its part. Weights of equal
    value are stored once (save_multifunction deduplicates consts across functions by value), so the decode and
    prefill functions of one model share every weight blob."""
    import coremltools as ct

    desc = ct.utils.MultiFunctionDescriptor()
    for name, path in parts:
        desc.add_function(str(path), "main", name)  # (model_path, src_function_name, target_function_name)
    desc.default_function_name = default
    ct.utils.save_multifunction(desc, str(pkg))


def _convert_phases(spec: BuildSpec, model, plan, untied: bool, pkg: Path, timed) -> None:
    """Convert (and compress) every function of ``spec`` and save the package at ``pkg``: one function, or for
    ``decode+prefill`` the decode and prefill steps merged into one package with shared weights."""

    phases = phases_of(spec.phase)
    parts: list[tuple[str, Path]] = []
    for i, phase in enumerate(phases):
        suffix = "" if len(phases) == 1 else f"_{phase}"
        share = 0.55 / len(phases)
        step = make_step(model, spec, phase)
        rows = "" if phase == "decode" else f", {spec.q_len} prompt tokens per call"
        emit(0.20 + i * share, "convert", f"tracing and converting the {phase} step ({spec.variant}, KV as "
             f"{spec.kv_mode}, ctx {spec.ctx}{rows})")
        mlmodel = timed(f"convert{suffix}_s", convert_step, step, keep_duplicate_consts=untied)
        del step
        if plan is not None:
            emit(0.20 + (i + 0.7) * share, "compress", f"compressing weights: {spec.compression}")
            mlmodel = timed(f"compress{suffix}_s", compress_model, mlmodel, plan)
        target = pkg if len(phases) == 1 else pkg.parent / f".{phase}.mlpackage"
        emit(0.20 + (i + 0.9) * share, "save", f"saving the {phase} .mlpackage")
        timed(f"save{suffix}_s", mlmodel.save, str(target))
        del mlmodel
        parts.append((phase, target))
    if len(parts) > 1:
        emit(0.85, "save", f"merging {' and '.join(phases)} into one package (weights stored once)")
        timed("merge_s", save_functions, parts, pkg, phases[0])
        for _, part in parts:
            shutil.rmtree(part)


def write_package(spec: BuildSpec, model, pkg: Path) -> dict[str, float]:
    """The package of a materialised build of ``spec`` from ``model`` (fp16 torch weights with values, not yet
    untied), saved at ``pkg`` as :func:`materialised_group` makes it: untied if the compression needs it, every
    phase converted and compressed, multi-function merged. Returns the timings (tests/test_quick_passes_kinds.py)."""
    plan = _plan(spec, geometry_of(load_config(spec.source)).num_layers)
    clock = Clock()
    _convert_phases(spec, model, plan, _untie_if_needed(model, plan, copy_values=True), pkg, clock)
    return clock.timings


def _plan(spec: BuildSpec, num_layers: int):
    if not spec.compression:
        return None

    return parse_spec(spec.compression, num_layers)


def _untie_if_needed(model, plan, copy_values: bool) -> bool:
    if plan is None:
        return False

    if needs_untie(plan) and untie_embeddings_(model, copy_values=copy_values):
        emit(0.04, "compress", "embedding and lm_head get different precisions: untied them")
        return True
    return False


def _describe(src, geometry, weights: str) -> str:
    return (f"building {src.label} ({weights}, {geometry.num_layers} layers, "
            f"{geometry.num_q_heads}/{geometry.num_kv_heads} heads)")


def _analyses(spec: BuildSpec, geometry, programs, timings: dict[str, float], equivalences: ReducedEquivalences,
              checks: dict[str, tuple], untied: bool, together: list[str], package: Path | None, peak_rss: int,
              extra: dict[str, Any] | None = None) -> tuple:
    """One Analysis per function: the program, and the build record with that function's phase's checks.
    ``peak_rss``: of the process that converted this build, up to its end."""

    stored = spec
    info = BuildInfo(
        key=spec.key,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        spec=stored,
        geometry=geometry,
        versions={**tool_versions(), **(coreai_versions(bool(spec.compression)) if spec.backend == COREAI else {})},
        timings_s=timings,
        peak_rss_bytes=peak_rss,
        package_bytes=(sum(f.stat().st_size for f in package.rglob("*") if f.is_file())
                       if package is not None else None),
        equivalence=None,
        untied_embeddings=untied,
        # keys this one request built (one child process and its workers)
        extra={**({"built_together": together} if len(together) > 1 else {}), **(extra or {})},
    )
    out = []
    for p in programs:
        phase = stored.phase_of(p.function)
        out.append(Analysis(p, replace(info, equivalence=equivalences.result(spec.for_phase(phase)),
                                       checks=checks[phase])))
    return tuple(out)


def _torch_checks(spec: BuildSpec, equivalences: ReducedEquivalences, phases) -> dict[str, tuple]:
    stored = spec
    return {p: (torch_check(equivalences.result(spec.for_phase(p)), stored, reduced_weights_text(spec.source)),)
            for p in phases}


def value_free_programs(spec: BuildSpec, out_dir: Path, progress=None) -> tuple[list, dict[str, float], bool]:
    """The value-free conversions of one build: its own model (every parameter a zero page), every phase traced,
    the weights made value-free views, each trace converted, compressed and walked. Returns the programs (one
    per function), the timings and whether the embedding was untied. ``progress(fraction_of_build, stage,
    message)`` reports; a worker process passes none (its parent reports for it)."""
    say = progress or (lambda *_: None)
    src = spec.source
    geometry = geometry_of(load_config(src))
    clock = Clock()
    say(0.0, "model", _describe(src, geometry, "value-free weights: shapes and dtypes, no values"))
    model = clock("build_model_s", build_value_free_model, src)
    plan = _plan(spec, geometry.num_layers)
    untied = _untie_if_needed(model, plan, copy_values=False)
    phases = phases_of(spec.phase)
    traces = []
    for phase in phases:  # trace every phase while the weights are zero pages: no memory
        say(0.08, "convert", f"tracing the {phase} step of {spec.variant} (KV as {spec.kv_mode}, ctx {spec.ctx})")
        step = make_step(model, spec, phase, lazy_cache=True)
        suffix = "" if phase == spec.phase else f"_{phase}"
        with ZeroPageProducts(model):  # the weights are zeros: products with them are too, uncomputed
            traces.append((clock(f"trace{suffix}_s", trace_step, step), step))
    clock("weights_s", assign_value_free_weights_, model)
    for _, step in traces:  # the emptied lazy caches as one-value views: the same zeros, no scan per buffer
        assign_value_free_caches_(step)
    programs = []
    for phase, (traced, step) in zip(phases, traces, strict=True):
        suffix = "" if len(phases) == 1 else f"_{phase}"
        say(0.15, "convert", f"converting the {phase} step of {spec.variant} with value-free weights")
        prog = clock(f"convert{suffix}_s", to_program, traced, step, keep_duplicate_consts=untied)
        del traced, step
        if plan is not None:
            say(0.6, "compress", f"laying out the compressed weights: {spec.compression}")
            clock(f"compress{suffix}_s", compress_program, prog, plan, out_dir)
        say(0.8, "walk", f"walking the value-free {phase} program (no package is written)")
        program = clock(f"walk{suffix}_s", walk_program, prog, out_dir)
        programs.append(replace(program, function=phase) if len(phases) > 1 else program)
        del prog
    traces.clear()
    return programs, clock.timings, untied


def value_free_job(spec_json: dict, out_dir: str) -> dict:
    """:func:`value_free_programs` in a worker process (``progress.worker_pool``: forked from the build child on
    Linux): the programs as ``program_json``, the timings, the untie flag and the worker's
    peak RSS (a forked worker's counts the pages it shares with the child, as a spawned one counted its imports)."""
    import torch

    quiet_coremltools()
    torch.set_num_threads(1)  # the build child converts on the other core
    programs, timings, untied = value_free_programs(BuildSpec.from_json(spec_json), Path(out_dir))
    return {"programs": [program_to_json(p) for p in programs], "timings_s": timings, "untied": untied,
            "peak_rss_bytes": peak_rss_bytes()}


class _Workers:
    """The builds of a group after the first, converted in worker processes beside the build child: as many
    as the machine has cores beside the child's own (none on one core, nor for models of the reduced model's size:
    then they run here, in turn)."""

    def __init__(self, specs: list[BuildSpec], out_dirs, workers: SharedWorkers | None):
        self.futures = {s.key: workers.submit(value_free_job, s.to_json(), str(out_dirs[s.key])) for s in specs} \
            if workers is not None and self.count(specs) else {}

    @staticmethod
    def count(specs: list[BuildSpec]) -> int:
        """Worker processes for ``specs``: none for models of the reduced model's size (they convert before a worker
        would have started), else one per spare core."""
        return 0 if not specs or all(is_reduced_size(s) for s in specs) else min(len(specs), (os.cpu_count() or 1) - 1)

    def result(self, spec: BuildSpec, out_dir: Path, progress) -> tuple[list, dict[str, float], bool, int, bool]:
        """(programs, timings, untied, peak RSS of the process that converted them, converted in a worker)."""
        if spec.key not in self.futures:
            programs, timings, untied = value_free_programs(spec, out_dir, progress)
            return programs, timings, untied, peak_rss_bytes(), False
        t = time.monotonic()
        doc = self.futures.pop(spec.key).result()
        programs = [program_from_json(Field(p, f"worker's {spec.variant} program"), SCHEMA_VERSION)
                    for p in doc["programs"]]
        return (programs, {**doc["timings_s"], "worker_wait_s": round(time.monotonic() - t, 3)}, doc["untied"],
                doc["peak_rss_bytes"], True)

    def close(self) -> None:
        for future in self.futures.values():
            future.cancel()


def analysis_workers(group: list[BuildSpec]) -> int:
    """Worker processes :func:`analysis_group` uses for ``group`` (its builds after the first)."""
    return _Workers.count(group[1:])


def analysis_group(group: list[BuildSpec], out_dirs, equivalences: ReducedEquivalences, done: int, total: int):
    """Value-free builds of one source, each with its own value-free model: the first converted here, the others
    at the same time in worker processes (:class:`_Workers`; an A/B's two variants at once on two cores), each
    traced over zero placeholders, converted, compressed and walked (:func:`value_free_programs`). No package."""

    together = [s.key for s in group]
    workers = _Workers(group[1:], out_dirs, equivalences.workers)
    if workers.futures:
        emit((done + 0.01) / total, "convert", f"converting {', '.join(s.variant for s in group[1:])} in "
             f"{len(workers.futures)} worker process(es) beside this one")
    try:
        for i, spec in enumerate(group):
            def progress(fraction, stage, message, base=(done + i) / total):
                emit(base + fraction / total, stage, message)

            programs, timings, untied, peak, in_worker = workers.result(spec, out_dirs[spec.key], progress)
            phases = phases_of(spec.phase)
            checks = _torch_checks(spec, equivalences, phases)
            if "decode" in checks:
                checks["decode"] += (interpreter_not_run(spec.for_phase("decode"),
                                                         "an analysis-mode build has value-free weights and keeps "
                                                         "no package; build it with --mode materialised to run it"),)
            geometry = geometry_of(load_config(spec.source))
            extra = {"converted_in_worker": True} if in_worker else {}
            yield spec, _analyses(spec, geometry, programs, timings, equivalences, checks, untied, together, None,
                                  peak, extra)
    finally:
        workers.close()


def _walk_package(pkg: Path) -> list:
    return [replace(read_program(pkg, fn), path=PACKAGE_NAME) for fn in list_functions(pkg)]


def materialised_group(group: list[BuildSpec], out_dirs, equivalences: ReducedEquivalences, done: int, total: int):
    """Builds with weight values (a runnable package): one fp16 model, then per build and phase trace →
    ct.convert → optional coremltools.optimize compression → save (phases merged into one package) → walk →
    the decode function in the MIL interpreter against torch."""
    import torch


    src = group[0].source
    geometry = geometry_of(load_config(src))
    shared = Clock()
    weights = "safetensors weights" if src.has_real_weights else f"seeded random weights, seed {src.seed}"
    emit(0.02, "model", _describe(src, geometry, f"{weights}, fp16"))
    model = shared("build_model_s", build_model, src, torch.float16)
    plan = _plan(group[0], geometry.num_layers)
    untied = _untie_if_needed(model, plan, copy_values=True)
    together = [s.key for s in group]
    for spec in group:
        clock = Clock()
        phases = phases_of(spec.phase)
        decode = spec.for_phase("decode")
        reference, tokens = None, []
        if "decode" in phases and interpreter_fits(model, spec.ctx):  # torch fp16 logits, before conversion
            tokens = list(clock("equivalence_wait_s", equivalences.result, decode).tokens)
            reference = clock("reference_s", interpreter_reference, model, decode, tokens)
        pkg = out_dirs[spec.key] / PACKAGE_NAME
        _convert_phases(spec, model, plan, untied, pkg, clock)
        emit(0.95, "walk", "walking the saved MIL program")
        programs = clock("walk_s", _walk_package, pkg)
        checks = clock("equivalence_wait_s", _torch_checks, spec, equivalences, phases)
        if "decode" in checks:
            emit(0.97, "check", "running the decode function in the MIL interpreter against torch")
            function = "decode" if len(phases) > 1 else None
            checks["decode"] += (clock("interpreter_check_s", interpreter_check, pkg, decode, tokens, reference,
                                       function),)
        timings = {**shared.timings, **clock.timings}
        yield spec, _analyses(spec, geometry, programs, timings, equivalences, checks, untied, together, pkg,
                              peak_rss_bytes())
