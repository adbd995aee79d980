"""The conversion child process: ``python -m analyzer.build.convert REQUEST.json BUILDS_DIR``.

Runs one build end to end (torch model → equivalence → trace → ct.convert → optional compression → save →
MIL walk → analysis.json) in its own process, because a full-size conversion needs ~15 GB and ~2.5 min
(docs/measurements.md) and must neither block nor bloat the dashboard. It reports progress as ``@@qfold {json}`` lines
on stdout, holds the per-key and machine-wide locks itself (so they are released only when the work
really stops), writes into ``.tmp-<key>-<pid>/`` and renames it into place as its very last step.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
import traceback
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from analyzer.build.builds import LOG_FILE, PACKAGE_NAME, PROGRESS_PREFIX, BuildSpec, is_complete, tool_versions
from analyzer.build.state import (
    QueueEntry,
    clean_stale_tmp,
    key_lock,
    queue_entry_path,
    tmp_folder,
    write_queue_entry,
)
from analyzer.errors import BuildError, QfoldError
from analyzer.fsio import read_json, write_json_atomic
from analyzer.graph.record import ANALYSIS_FILE, Analysis, function_analysis_file, write_analysis

_T0 = time.monotonic()
_LOG: list[str] = []


def emit(fraction: float, stage: str, message: str) -> None:
    line = f"[{time.monotonic() - _T0:7.1f} s] {stage}: {message}"
    _LOG.append(line)
    print(PROGRESS_PREFIX + json.dumps({"fraction": round(fraction, 3), "stage": stage, "message": message}),
          flush=True)


def peak_rss_bytes(platform: str = sys.platform) -> int:
    """Peak resident memory of this process so far, in bytes. getrusage(2) gives ``ru_maxrss`` in kilobytes on
    Linux (Linux man-pages, getrusage(2)) and in bytes on macOS (Darwin's getrusage(2) man page)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if platform == "darwin" else 1024)


def check_numpy() -> None:
    """coremltools 9.0's ``aten::Int``/``aten::Bool`` cast of size-1 constants fails under NumPy ≥ 2.4
    ("only 0-dimensional arrays can be converted to Python scalars", docs/measurements.md). qfold pins numpy<2.4
    in requirements.txt rather than patching coremltools at run time; fail early and say so."""
    import numpy as np

    major, minor = (int(x) for x in np.__version__.split(".")[:2])
    if (major, minor) >= (2, 4):
        raise BuildError(
            f"numpy {np.__version__} breaks coremltools 9.0's torch frontend (aten::Int on size-1 arrays); "
            "install the pinned numpy<2.4 from requirements.txt"
        )


def ct_io(step):
    """Core ML inputs, states and outputs of a decode step (q_len 1) or a prefill step (q_len N: ``input_ids``
    ``[1, N]``, ``causal_mask`` ``[1, 1, N, S]``, or ``[1, 1, N, S + N]`` with the cache as inputs)."""
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


def convert_step(step, keep_duplicate_consts: bool = False):
    """Trace the decode (or prefill) step and convert it to an iOS18 ML Program (fp16 compute). Returns the
    MLModel."""
    import coremltools as ct
    import torch

    from analyzer.model.decode import example_inputs
    from analyzer.model.prefill import PrefillStep, example_prefill_inputs

    example = example_prefill_inputs(step) if isinstance(step, PrefillStep) else example_inputs(step)
    with torch.no_grad():
        traced = torch.jit.trace(step, example, check_trace=False)
    for name, buf in traced.named_buffers():  # tracing ran one step: empty the cache again
        if "_cache_" in name:
            buf.zero_()
    inputs, states, outputs = ct_io(step)
    kwargs = dict(inputs=inputs, outputs=outputs, minimum_deployment_target=ct.target.iOS18,
                  compute_precision=ct.precision.FLOAT16, convert_to="mlprogram")
    if states:
        kwargs["states"] = states
    if keep_duplicate_consts:
        # an untied embedding/lm_head pair would be merged back into one const (docs/compression.md)
        pipeline = ct.PassPipeline.DEFAULT
        pipeline.remove_passes(["common::const_deduplication"])
        kwargs["pass_pipeline"] = pipeline
    return ct.convert(traced, **kwargs)


def _equivalence(spec: BuildSpec, model, cache_dir: Path | None):
    """The torch report depends on the source, KV mode, ctx and steps but not on the variant being built, nor
    on compression (applied to the converted program, never to the torch model), so every build of one
    source shares one computation (for the full-size model it is minutes of fp16 matmuls on the CPU),
    cached under ``builds/.equivalence/``. It is about uncompressed torch weights only: each build's record
    says so in its ``checks`` (``analyzer.build.equivalence``), beside the check of the package itself."""
    import hashlib

    from analyzer.graph.buildinfo import equivalence_from_json, equivalence_json
    from analyzer.graph.jsonfields import Field
    from analyzer.model.equivalence import check_equivalence, check_prefill_equivalence, prefill_tokens

    fingerprint = {k: v for k, v in spec.fingerprint().items() if k not in ("variant", "compression")}
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    cached = cache_dir / f"{digest}.json" if cache_dir is not None else None
    if cached is not None and cached.is_file():
        try:
            report = equivalence_from_json(Field(read_json(cached), str(cached)))
        except QfoldError as e:  # a damaged cache entry is computed again, not trusted
            emit(0.10, "equivalence", f"ignoring the cached check: {e}")
        else:
            emit(0.10, "equivalence", f"reusing the equivalence check of this source ({cached.name})")
            return report
    if spec.phase == "prefill":
        emit(0.10, "equivalence", f"prefilling {prefill_tokens(spec.ctx, spec.q_len)} prompt tokens in calls of "
             f"{spec.q_len} with every variant in fp32 and fp16")
        report = check_prefill_equivalence(model, spec.kv_mode, spec.ctx, spec.q_len)
    else:
        emit(0.10, "equivalence", f"decoding {spec.equivalence_steps} tokens with every variant in fp32 and fp16")
        report = check_equivalence(model, spec.kv_mode, spec.ctx, spec.equivalence_steps)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(cached, equivalence_json(report))
    return report


def make_step(model, spec: BuildSpec, phase: str):
    """The torch step one function of ``spec`` converts: a decode step, or a prefill step of ``spec.q_len``."""
    from analyzer.model.decode import DecodeStep
    from analyzer.model.prefill import PrefillStep

    if phase == "prefill":
        return PrefillStep(model, spec.ctx, spec.variant, spec.kv_mode, spec.q_len).eval()
    return DecodeStep(model, spec.ctx, spec.variant, spec.kv_mode).eval()


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


def build(spec: BuildSpec, out_dir: Path, equivalence_cache: Path | None = None) -> tuple[Analysis, ...]:
    """Do the work of one build into ``out_dir``; returns one analysis per function of its package, the
    default function first (a ``decode+prefill`` build: decode, then prefill)."""
    import torch

    from analyzer.build.equivalence import interpreter_check, interpreter_reference, torch_check
    from analyzer.graph.buildinfo import BuildInfo
    from analyzer.graph.mil import list_functions, read_program
    from analyzer.model.decode import build_model, untie_embeddings_
    from analyzer.model.prefill import phases_of
    from analyzer.model.sources import geometry_of, load_config

    check_numpy()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    timings: dict[str, float] = {}

    def timed(name, fn, *args, **kwargs):
        t = time.monotonic()
        result = fn(*args, **kwargs)
        timings[name] = round(time.monotonic() - t, 3)
        return result

    src = spec.source
    geometry = geometry_of(load_config(src))
    weights = "safetensors weights" if src.has_real_weights else f"seeded random weights, seed {src.seed}"
    emit(0.02, "model", f"building {src.label} ({weights}, {geometry.num_layers} layers, "
         f"{geometry.num_q_heads}/{geometry.num_kv_heads} heads)")
    model = timed("build_model_s", build_model, src)
    phases = phases_of(spec.phase)
    equivalence = {p: timed("equivalence_s" if len(phases) == 1 else f"equivalence_{p}_s", _equivalence,
                            spec.for_phase(p), model, equivalence_cache) for p in phases}
    plan = None
    untied = False
    if spec.compression:
        from analyzer.build.compress import needs_untie, parse_spec

        plan = parse_spec(spec.compression, geometry.num_layers)
        if needs_untie(plan) and untie_embeddings_(model):
            untied = True
            emit(0.18, "compress", "embedding and lm_head get different precisions: untied them")
    decode_tokens = list(equivalence["decode"].tokens) if "decode" in equivalence else []
    reference = (timed("reference_s", interpreter_reference, model, spec.for_phase("decode"), decode_tokens)
                 if decode_tokens else None)  # torch fp16 logits for the interpreter check, before the model goes
    pkg = out_dir / PACKAGE_NAME
    _convert_phases(spec, model, plan, untied, pkg, timed)
    del model
    emit(0.95, "walk", "walking the saved MIL program")
    programs = timed("walk_s", lambda: [replace(read_program(pkg, fn), path=PACKAGE_NAME)
                                        for fn in list_functions(pkg)])
    stored = spec.stored()
    checks = {p: (torch_check(equivalence[p], stored),) for p in phases}
    if "decode" in checks:
        emit(0.97, "check", "running the decode function in the MIL interpreter against torch")
        function = "decode" if len(phases) > 1 else None
        checks["decode"] += (timed("interpreter_check_s", interpreter_check, pkg, spec.for_phase("decode"),
                                   decode_tokens, reference, function),)
    info = BuildInfo(
        key=spec.key,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        spec=stored,
        geometry=geometry,
        versions=tool_versions(),
        timings_s=timings,
        peak_rss_bytes=peak_rss_bytes(),
        package_bytes=sum(f.stat().st_size for f in pkg.rglob("*") if f.is_file()),
        equivalence=equivalence[phases[0]],
        untied_embeddings=untied,
        checks=checks[phases[0]],
    )
    return tuple(Analysis(p, replace(info, equivalence=equivalence[stored.phase_of(p.function)],
                                     checks=checks[stored.phase_of(p.function)])) for p in programs)


class _QueueEntry:
    """A file in ``builds/.queue`` so every session can show what is queued or converting; it exists only while
    this process holds the build's key lock (``analyzer.build.state``)."""

    def __init__(self, root: Path, key: str):
        self.path = queue_entry_path(root, key)
        self.key = key
        self.since = time.time()

    def set(self, state: str) -> None:
        write_queue_entry(self.path, QueueEntry(self.key, os.getpid(), state, self.since))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def _result(outcome: str) -> None:
    """Tell the parent what this request did: ``built`` or ``reused`` (an identical request finished first)."""
    print(PROGRESS_PREFIX + json.dumps({"result": outcome}), flush=True)


def run(request: Path, root: Path) -> int:
    from filelock import FileLock, Timeout

    spec = BuildSpec.from_json(read_json(request), str(request))
    key = spec.key
    final = root / key
    with key_lock(root, key):
        entry = _QueueEntry(root, key)
        try:
            if is_complete(final):
                emit(1.0, "done", f"reusing {final}")
                _result("reused")
                return 0
            clean_stale_tmp(root, holding=key)
            entry.set("queued")
            slot = FileLock(str(root / ".locks" / "convert.lock"))
            while True:
                try:
                    slot.acquire(timeout=5)
                    break
                except Timeout:
                    emit(0.0, "queued", "waiting: another conversion is running on this machine")
            try:
                entry.set("running")
                tmp = tmp_folder(root, key)
                tmp.mkdir()
                try:
                    analyses = build(spec, tmp, root / ".equivalence")
                    timings = {**analyses[0].build.timings_s, "total_s": round(time.monotonic() - _T0, 3)}
                    for a in analyses:  # analysis.json for the default function, one file for each other one
                        name = ANALYSIS_FILE if a is analyses[0] else function_analysis_file(a.function)
                        write_analysis(tmp / name, replace(a, build=replace(a.build, timings_s=timings)))
                    (tmp / LOG_FILE).write_text("\n".join(_LOG) + "\n")
                    os.rename(tmp, final)  # the one step that makes the build look finished
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
            finally:
                slot.release()
        finally:
            entry.remove()
    emit(1.0, "done", str(final))
    _result("built")
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m analyzer.build.convert REQUEST.json BUILDS_DIR", file=sys.stderr)
        return 2
    from analyzer import quiet_coremltools

    quiet_coremltools()
    try:
        return run(Path(argv[0]), Path(argv[1]))
    except QfoldError as e:
        print(PROGRESS_PREFIX + json.dumps({"error": str(e)}), flush=True)
        return 1
    except Exception as e:  # the parent shows this line; the traceback goes to the log
        traceback.print_exc()
        print(PROGRESS_PREFIX + json.dumps({"error": f"{type(e).__name__}: {e}"[:500]}), flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
