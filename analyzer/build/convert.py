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

from analyzer.build.builds import (
    LOG_FILE,
    PACKAGE_NAME,
    PROGRESS_PREFIX,
    QUEUE_DIR,
    BuildSpec,
    QueueEntry,
    clean_stale_tmp,
    is_complete,
    tool_versions,
    write_queue_entry,
)
from analyzer.errors import BuildError, QfoldError
from analyzer.fsio import read_json, write_json_atomic
from analyzer.graph.record import ANALYSIS_FILE, Analysis, write_analysis

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
    import coremltools as ct
    import numpy as np

    g = step.geometry
    cache_shape = (1, g.num_kv_heads, step.ctx, g.head_dim)
    inputs = [ct.TensorType(name="input_ids", shape=(1, 1), dtype=np.int32),
              ct.TensorType(name="current_pos", shape=(1,), dtype=np.int32),
              ct.TensorType(name="causal_mask", shape=(1, 1, 1, step.ctx), dtype=np.float16)]
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
    """Trace the decode step and convert it to an iOS18 ML Program (fp16 compute). Returns the MLModel."""
    import coremltools as ct
    import torch

    from analyzer.model.decode import example_inputs

    with torch.no_grad():
        traced = torch.jit.trace(step, example_inputs(step), check_trace=False)
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
    from analyzer.model.equivalence import check_equivalence

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
    emit(0.10, "equivalence", f"decoding {spec.equivalence_steps} tokens with every variant in fp32 and fp16")
    report = check_equivalence(model, spec.kv_mode, spec.ctx, spec.equivalence_steps)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(cached, equivalence_json(report))
    return report


def build(spec: BuildSpec, out_dir: Path, equivalence_cache: Path | None = None) -> Analysis:
    """Do the work of one build into ``out_dir``; returns its analysis."""
    import torch

    from analyzer.build.equivalence import interpreter_check, interpreter_reference, torch_check
    from analyzer.graph.buildinfo import BuildInfo
    from analyzer.graph.mil import read_program
    from analyzer.model.decode import DecodeStep, build_model, untie_embeddings_
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
    equivalence = timed("equivalence_s", _equivalence, spec, model, equivalence_cache)
    plan = None
    untied = False
    if spec.compression:
        from analyzer.build.compress import needs_untie, parse_spec

        plan = parse_spec(spec.compression, geometry.num_layers)
        if needs_untie(plan) and untie_embeddings_(model):
            untied = True
            emit(0.18, "compress", "embedding and lm_head get different precisions: untied them")
    step = DecodeStep(model, spec.ctx, spec.variant, spec.kv_mode).eval()
    emit(0.20, "convert", f"tracing and converting ({spec.variant}, KV as {spec.kv_mode}, ctx {spec.ctx})")
    mlmodel = timed("convert_s", convert_step, step, keep_duplicate_consts=untied)
    reference = timed("reference_s", interpreter_reference, model, spec, list(equivalence.tokens))
    del step, model
    if plan is not None:
        from analyzer.build.compress import compress_model

        emit(0.75, "compress", f"compressing weights: {spec.compression}")
        mlmodel = timed("compress_s", compress_model, mlmodel, plan)
    emit(0.90, "save", "saving the .mlpackage")
    pkg = out_dir / PACKAGE_NAME
    timed("save_s", mlmodel.save, str(pkg))
    del mlmodel
    emit(0.95, "walk", "walking the saved MIL program")
    program = replace(timed("walk_s", read_program, pkg), path=PACKAGE_NAME)
    emit(0.97, "check", "running the package in the MIL interpreter against torch")
    stored = spec.stored()
    checks = (torch_check(equivalence, stored),
              timed("interpreter_check_s", interpreter_check, pkg, spec, list(equivalence.tokens), reference))
    info = BuildInfo(
        key=spec.key,
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        spec=stored,
        geometry=geometry,
        versions=tool_versions(),
        timings_s=timings,
        peak_rss_bytes=peak_rss_bytes(),
        package_bytes=sum(f.stat().st_size for f in pkg.rglob("*") if f.is_file()),
        equivalence=equivalence,
        untied_embeddings=untied,
        checks=checks,
    )
    return Analysis(program, info)


class _QueueEntry:
    """A file in ``builds/.queue`` so every session can show what is queued or converting."""

    def __init__(self, root: Path, key: str):
        self.path = root / QUEUE_DIR / f"{key}.{os.getpid()}.json"
        self.path.parent.mkdir(exist_ok=True)
        self.key = key
        self.since = time.time()

    def set(self, state: str) -> None:
        write_queue_entry(self.path, QueueEntry(self.key, os.getpid(), state, self.since))

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def run(request: Path, root: Path) -> int:
    from filelock import FileLock, Timeout

    spec = BuildSpec.from_json(json.loads(request.read_text()), str(request))
    key = spec.key
    final = root / key
    (root / ".locks").mkdir(parents=True, exist_ok=True)
    entry = _QueueEntry(root, key)
    try:
        with FileLock(str(root / ".locks" / f"{key}.lock")):
            if is_complete(final):
                emit(1.0, "done", f"reusing {final}")
                return 0
            clean_stale_tmp(root)
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
                tmp = root / f".tmp-{key}-{os.getpid()}"
                tmp.mkdir()
                try:
                    analysis = build(spec, tmp, root / ".equivalence")
                    info = analysis.build
                    timings = {**info.timings_s, "total_s": round(time.monotonic() - _T0, 3)}
                    write_analysis(tmp / ANALYSIS_FILE, replace(analysis, build=replace(info, timings_s=timings)))
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
