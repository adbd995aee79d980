"""How each build mode makes a build's analyses (``analyzer.build.builds.BUILD_MODES``), inside the conversion
child (``analyzer.build.convert``):

* ``analysis``: one value-free model per source; every variant and phase traced while the weights are zero
  pages, then converted to a ``milinternal`` program, compressed value-free if asked, and walked from a
  header-only skeleton (``analyzer.build.valuefree``). No package; the interpreter check is recorded as not run.
* ``materialised``: one fp16 model per source; per build and phase ``ct.convert``, optional compression, save
  (phases merged into one multi-function package), walk, and the decode function in the MIL interpreter
  against torch.

Both record the variants' torch equivalence checked on a reduced model (``analyzer.build.equivalence``).
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyzer.build.builds import PACKAGE_NAME, BuildSpec, tool_versions
from analyzer.build.equivalence import ReducedEquivalences
from analyzer.build.progress import Clock, emit, peak_rss_bytes
from analyzer.build.step import convert_step
from analyzer.graph.record import Analysis


def make_step(model, spec: BuildSpec, phase: str, lazy_cache: bool = False):
    """The torch step one function of ``spec`` converts: a decode step, or a prefill step of ``spec.q_len``
    (``lazy_cache``: KV buffers resident only where written, for value-free traces)."""
    from analyzer.model.decode import DecodeStep
    from analyzer.model.prefill import PrefillStep

    if phase == "prefill":
        return PrefillStep(model, spec.ctx, spec.variant, spec.kv_mode, spec.q_len, lazy_cache=lazy_cache).eval()
    return DecodeStep(model, spec.ctx, spec.variant, spec.kv_mode, lazy_cache=lazy_cache).eval()


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
    from analyzer.model.prefill import phases_of

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
            from analyzer.build.compress import compress_model

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


def _plan(spec: BuildSpec, num_layers: int):
    if not spec.compression:
        return None
    from analyzer.build.compress import parse_spec

    return parse_spec(spec.compression, num_layers)


def _untie_if_needed(model, plan, copy_values: bool) -> bool:
    if plan is None:
        return False
    from analyzer.build.compress import needs_untie
    from analyzer.model.decode import untie_embeddings_

    if needs_untie(plan) and untie_embeddings_(model, copy_values=copy_values):
        emit(0.04, "compress", "embedding and lm_head get different precisions: untied them")
        return True
    return False


def _describe(src, geometry, weights: str) -> str:
    return (f"building {src.label} ({weights}, {geometry.num_layers} layers, "
            f"{geometry.num_q_heads}/{geometry.num_kv_heads} heads)")


def _analyses(spec: BuildSpec, geometry, programs, timings: dict[str, float], equivalences: ReducedEquivalences,
              checks: dict[str, tuple], untied: bool, together: list[str], package: Path | None) -> tuple:
    """One Analysis per function: the program, and the build record with that function's phase's checks."""
    from analyzer.graph.buildinfo import BuildInfo

    stored = spec.stored()
    info = BuildInfo(
        key=spec.key,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        spec=stored,
        geometry=geometry,
        versions=tool_versions(),
        timings_s=timings,
        peak_rss_bytes=peak_rss_bytes(),  # of this process, up to the end of this build
        package_bytes=(sum(f.stat().st_size for f in package.rglob("*") if f.is_file())
                       if package is not None else None),
        equivalence=None,
        untied_embeddings=untied,
        extra={"built_together": together} if len(together) > 1 else {},  # keys converted by this one process
    )
    out = []
    for p in programs:
        phase = stored.phase_of(p.function)
        out.append(Analysis(p, replace(info, equivalence=equivalences.result(spec.for_phase(phase)),
                                       checks=checks[phase])))
    return tuple(out)


def _torch_checks(spec: BuildSpec, equivalences: ReducedEquivalences, phases) -> dict[str, tuple]:
    from analyzer.build.equivalence import reduced_weights_text, torch_check

    stored = spec.stored()
    return {p: (torch_check(equivalences.result(spec.for_phase(p)), stored, reduced_weights_text(spec.source)),)
            for p in phases}


def analysis_group(group: list[BuildSpec], out_dirs, equivalences: ReducedEquivalences, done: int, total: int):
    """Value-free builds of one source: one model, every variant and phase traced over zero placeholders, then
    the weights made value-free views and each trace converted, compressed and walked in turn. No package."""
    from analyzer.build.equivalence import interpreter_not_run
    from analyzer.build.step import trace_step
    from analyzer.build.valuefree import compress_program, to_program, walk_program
    from analyzer.model.prefill import phases_of
    from analyzer.model.sources import geometry_of, load_config
    from analyzer.model.valuefree import assign_value_free_weights_, build_value_free_model

    src = group[0].source
    geometry = geometry_of(load_config(src))
    shared = Clock()
    emit(0.02, "model", _describe(src, geometry, "value-free weights: shapes and dtypes, no values"))
    model = shared("build_model_s", build_value_free_model, src)
    plan = _plan(group[0], geometry.num_layers)
    untied = _untie_if_needed(model, plan, copy_values=False)
    traces: dict[tuple[str, str], tuple[Any, Any]] = {}
    clocks = {spec.key: Clock() for spec in group}
    for spec in group:  # trace every variant and phase while the weights are zero pages: no memory
        for phase in phases_of(spec.phase):
            emit((done + 0.08) / total, "convert", f"tracing the {phase} step of {spec.variant} (KV as "
                 f"{spec.kv_mode}, ctx {spec.ctx})")
            step = make_step(model, spec, phase, lazy_cache=True)
            suffix = "" if phase == spec.phase else f"_{phase}"
            traces[(spec.key, phase)] = (clocks[spec.key](f"trace{suffix}_s", trace_step, step), step)
    shared("weights_s", assign_value_free_weights_, model)
    together = [s.key for s in group]
    for i, spec in enumerate(group):
        clock = clocks[spec.key]
        base = (done + i) / total
        phases = phases_of(spec.phase)
        programs = []
        for phase in phases:
            suffix = "" if len(phases) == 1 else f"_{phase}"
            traced, step = traces.pop((spec.key, phase))
            emit(base + 0.15 / total, "convert", f"converting the {phase} step of {spec.variant} with value-free "
                 "weights")
            prog = clock(f"convert{suffix}_s", to_program, traced, step, keep_duplicate_consts=untied)
            del traced, step
            if plan is not None:
                emit(base + 0.6 / total, "compress", f"laying out the compressed weights: {spec.compression}")
                clock(f"compress{suffix}_s", compress_program, prog, plan, out_dirs[spec.key])
            emit(base + 0.8 / total, "walk", f"walking the value-free {phase} program (no package is written)")
            program = clock(f"walk{suffix}_s", walk_program, prog, out_dirs[spec.key])
            programs.append(replace(program, function=phase) if len(phases) > 1 else program)
            del prog
        checks = _torch_checks(spec, equivalences, phases)
        if "decode" in checks:
            checks["decode"] += (interpreter_not_run(spec.for_phase("decode"),
                                                     "an analysis-mode build has value-free weights and keeps no "
                                                     "package; build it with --mode materialised to run it"),)
        timings = {**shared.timings, **clock.timings}
        yield spec, _analyses(spec, geometry, programs, timings, equivalences, checks, untied, together, None)


def _walk_package(pkg: Path) -> list:
    from analyzer.graph.mil import list_functions, read_program

    return [replace(read_program(pkg, fn), path=PACKAGE_NAME) for fn in list_functions(pkg)]


def materialised_group(group: list[BuildSpec], out_dirs, equivalences: ReducedEquivalences, done: int, total: int):
    """Builds with weight values (a runnable package): one fp16 model, then per build and phase trace →
    ct.convert → optional coremltools.optimize compression → save (phases merged into one package) → walk →
    the decode function in the MIL interpreter against torch."""
    import torch

    from analyzer.build.equivalence import interpreter_check, interpreter_fits, interpreter_reference
    from analyzer.model.decode import build_model
    from analyzer.model.prefill import phases_of
    from analyzer.model.sources import geometry_of, load_config

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
        yield spec, _analyses(spec, geometry, programs, timings, equivalences, checks, untied, together, pkg)
