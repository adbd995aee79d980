"""The conversion child process: ``python -m analyzer.build.convert REQUEST.json BUILDS_DIR``.

Runs one or more builds end to end in its own process, because a conversion needs minutes and gigabytes
(design.md) and must neither block nor bloat the dashboard. The request holds one build spec, or
``{"specs": [...]}``: the builds of an A/B pair share one process, one torch model and one equivalence check,
and in ``analysis`` mode one value-free model traced once per variant (``analyzer.build.valuefree``), so the
pair costs less than one materialised conversion. Per build:

* ``analysis``: value-free model → traces → ``milinternal`` program → optional value-free compression →
  skeleton walk → ``analysis.json`` (no package);
* ``materialised``: fp16 model with real or seeded random weights → ``ct.convert`` → optional
  ``coremltools.optimize`` compression → ``model.mlpackage`` → walk → ``analysis.json``.

The numerical equivalence of the variants is checked on a reduced model of the same attention geometry
(``decode.reduced_source``: 2 layers, random weights), cached under ``builds/.equivalence/``; every analysis
says which model it was checked on. The child reports progress as ``@@qfold {json}`` lines on stdout, holds
the per-key and machine-wide locks itself (so they are released only when the work really stops), writes
each build into ``.tmp-<key>-<pid>/`` and renames it into place as that build's very last step.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from analyzer.build.builds import (
    LOG_FILE,
    PACKAGE_NAME,
    PROGRESS_PREFIX,
    BuildSpec,
    clean_stale_tmp,
    is_complete,
    tool_versions,
)
from analyzer.build.step import convert_step, ct_io  # noqa: F401  (re-exported: tests and tools import them here)
from analyzer.errors import BuildError, QfoldError
from analyzer.fsio import write_json_atomic
from analyzer.graph.record import ANALYSIS_FILE

_T0 = time.monotonic()
_LOG: list[str] = []


def emit(fraction: float, stage: str, message: str) -> None:
    line = f"[{time.monotonic() - _T0:7.1f} s] {stage}: {message}"
    _LOG.append(line)
    print(PROGRESS_PREFIX + json.dumps({"fraction": round(fraction, 3), "stage": stage, "message": message}),
          flush=True)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def check_numpy() -> None:
    """coremltools 9.0's ``aten::Int``/``aten::Bool`` cast of size-1 constants fails under NumPy ≥ 2.4
    ("only 0-dimensional arrays can be converted to Python scalars", design.md). qfold pins numpy<2.4
    in requirements.txt rather than patching coremltools at run time; fail early and say so."""
    import numpy as np

    major, minor = (int(x) for x in np.__version__.split(".")[:2])
    if (major, minor) >= (2, 4):
        raise BuildError(
            f"numpy {np.__version__} breaks coremltools 9.0's torch frontend (aten::Int on size-1 arrays); "
            "install the pinned numpy<2.4 from requirements.txt"
        )


class _Clock:
    """Seconds per named step, rounded to ms."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}

    def __call__(self, name: str, fn, *args, **kwargs):
        t = time.monotonic()
        result = fn(*args, **kwargs)
        self.timings[name] = round(self.timings.get(name, 0.0) + time.monotonic() - t, 3)
        return result


# ------------------------------------------------------------------------------------------------- equivalence
def _equivalence_key(spec: BuildSpec) -> tuple[str, str]:
    """(digest, description) of what an equivalence check depends on: the reduced source, KV mode, ctx, steps
    and tool versions; not the variant, the build mode nor the compression."""
    from analyzer.model.decode import reduced_source

    reduced = reduced_source(spec.source)
    fingerprint = {"source": reduced.fingerprint(), "kv_mode": spec.kv_mode, "ctx": spec.ctx,
                   "steps": spec.equivalence_steps, "versions": tool_versions()}
    digest = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    return digest, ", ".join(reduced.overrides)


def check_reduced_equivalence(spec_json: dict) -> dict:
    """The variants' numerical equivalence for a spec's attention geometry, KV mode and ctx, checked on the
    reduced model (``decode.reduced_source``), never on value-free weights. Runs in a worker process."""
    import torch

    from analyzer import quiet_coremltools
    from analyzer.graph.record import equivalence_json
    from analyzer.model.decode import build_model, reduced_source
    from analyzer.model.equivalence import check_equivalence

    quiet_coremltools()
    torch.set_num_threads(1)  # the conversion runs beside it
    spec = BuildSpec.from_json(spec_json)
    reduced = reduced_source(spec.source)
    report = equivalence_json(check_equivalence(build_model(reduced), spec.kv_mode, spec.ctx, spec.equivalence_steps))
    report["checked_on"] = {
        "model": "reduced", "overrides": list(reduced.overrides), "weights": f"random, seed {reduced.seed}",
        "note": "same attention geometry (query heads, KV heads, head_dim, family code) as the build; not the "
                "build's own weights (an analysis-mode build has no values)",
    }
    return report


class _Equivalences:
    """The equivalence checks a set of builds needs, read from ``builds/.equivalence/`` or computed in ONE
    worker process beside the conversions (off the critical path: the conversion passes run on one core)."""

    def __init__(self, specs: list[BuildSpec], cache_dir: Path | None):
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        self.cache_dir = cache_dir
        self.results: dict[str, dict] = {}
        self.futures: dict[str, Any] = {}
        self.pool = None
        for spec in specs:
            digest, reduced = _equivalence_key(spec)
            if digest in self.results or digest in self.futures:
                continue
            cached = cache_dir / f"{digest}.json" if cache_dir is not None else None
            if cached is not None and cached.is_file():
                emit(0.01, "equivalence", f"reusing the equivalence check of this geometry ({cached.name})")
                self.results[digest] = json.loads(cached.read_text())
                continue
            if self.pool is None:
                self.pool = ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"))
            emit(0.01, "equivalence", f"checking the variants' equivalence in a worker process: {spec.kv_mode} KV, "
                 f"ctx {spec.ctx}, {spec.equivalence_steps} tokens, fp32 and fp16, on a reduced model ({reduced}, "
                 "random weights)")
            from analyzer.build.convert import check_reduced_equivalence as job  # by module name, also under -m

            self.futures[digest] = self.pool.submit(job, spec.to_json())

    def result(self, spec: BuildSpec) -> dict:
        digest, _ = _equivalence_key(spec)
        if digest not in self.results:
            t = time.monotonic()
            report = self.futures.pop(digest).result()
            if time.monotonic() - t > 1:
                emit(0.9, "equivalence", f"waited {time.monotonic() - t:.0f} s for the equivalence check")
            if self.cache_dir is not None:
                self.cache_dir.mkdir(parents=True, exist_ok=True)
                write_json_atomic(self.cache_dir / f"{digest}.json", report)
            self.results[digest] = report
        return self.results[digest]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


# ------------------------------------------------------------------------------------------------- builds
def _geometry_json(g) -> dict[str, Any]:
    return {"model_type": g.model_type, "num_layers": g.num_layers, "num_q_heads": g.num_q_heads,
            "num_kv_heads": g.num_kv_heads, "head_dim": g.head_dim, "hidden_size": g.hidden_size,
            "vocab_size": g.vocab_size, "group_size": g.group_size}


def _group_key(spec: BuildSpec) -> str:
    """Builds that can share one torch model: same source, mode and compression (so the same untie)."""
    return json.dumps([spec.source.fingerprint(), spec.build_mode, spec.compression], sort_keys=True)


def build_all(specs: list[BuildSpec], out_dirs: dict[str, Path],
              equivalence_cache: Path | None = None) -> Iterator[tuple[BuildSpec, dict]]:
    """Do the work of ``specs`` (each into ``out_dirs[key]``), grouped so builds that can share a model do;
    yields each build's analysis document as soon as it is made."""
    import torch

    check_numpy()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    groups: dict[str, list[BuildSpec]] = {}
    for s in specs:
        groups.setdefault(_group_key(s), []).append(s)
    equivalences = _Equivalences(specs, equivalence_cache)
    try:
        done = 0
        for group in groups.values():
            run_group = _analysis_group if group[0].build_mode == "analysis" else _materialised_group
            for spec, doc in run_group(group, out_dirs, equivalences, done, len(specs)):
                done += 1
                yield spec, doc
    finally:
        equivalences.close()


def _plan(spec: BuildSpec, num_layers: int):
    if not spec.compression:
        return None
    from analyzer.build.compress import parse_spec

    return parse_spec(spec.compression, num_layers)


def _document(spec: BuildSpec, geometry, program, clock: _Clock, shared: dict[str, float], equivalence: dict,
              untied: bool, together: list[str], package: Path | None) -> dict:
    from analyzer.build.compress import compression_report
    from analyzer.graph.record import program_document

    doc = program_document(program)
    doc["program"]["path"] = PACKAGE_NAME if package is not None else ""
    return {
        "schema_version": doc["schema_version"],
        "key": spec.key,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "spec": spec.to_json(),
        "build_mode": spec.build_mode,
        "geometry": _geometry_json(geometry),
        "versions": tool_versions(),
        "timings": {**shared, **clock.timings},
        "built_together": together,  # keys converted by the same child process (sharing model and traces)
        "peak_rss_bytes": peak_rss_bytes(),  # of that process, up to the end of this build
        "package_bytes": (sum(f.stat().st_size for f in package.rglob("*") if f.is_file())
                          if package is not None else None),
        "equivalence": equivalence,
        "untied_embeddings": untied,
        "compression_report": compression_report(program),
        **{k: doc[k] for k in ("summary", "bytes", "program")},
    }


def _describe(src, geometry, weights: str) -> str:
    return (f"building {src.label} ({weights}, {geometry.num_layers} layers, "
            f"{geometry.num_q_heads}/{geometry.num_kv_heads} heads)")


def _analysis_group(group: list[BuildSpec], out_dirs, equivalences: _Equivalences, done: int, total: int):
    """Value-free builds of one source: one model, every variant traced over zero placeholders, then the
    weights made value-free views and each trace converted, compressed and walked in turn."""
    from analyzer.build.step import trace_step
    from analyzer.build.valuefree import compress_program, to_program, walk_program
    from analyzer.model.decode import (
        DecodeStep,
        assign_value_free_weights_,
        build_value_free_model,
        untie_embeddings_,
    )
    from analyzer.model.sources import geometry_of, load_config

    src = group[0].source
    geometry = geometry_of(load_config(src))
    shared = _Clock()
    emit(0.02, "model", _describe(src, geometry, "value-free weights: shapes and dtypes, no values"))
    model = shared("model_s", build_value_free_model, src)
    plan = _plan(group[0], geometry.num_layers)
    untied = False
    if plan is not None:
        from analyzer.build.compress import needs_untie

        if needs_untie(plan) and untie_embeddings_(model, copy_values=False):
            untied = True
            emit(0.04, "compress", "embedding and lm_head get different precisions: untied them")
    steps: dict[tuple[str, int], DecodeStep] = {}
    traces = {}
    clocks = {spec.key: _Clock() for spec in group}
    for spec in group:  # trace every variant while the weights are zero pages: no memory, no fp16 GEMV copies
        emit((done + 0.08) / total, "convert", f"tracing {spec.variant} (KV as {spec.kv_mode}, ctx {spec.ctx})")
        step = steps.get((spec.kv_mode, spec.ctx))
        if step is None:
            step = steps[(spec.kv_mode, spec.ctx)] = DecodeStep(model, spec.ctx, spec.variant, spec.kv_mode,
                                                                lazy_cache=True).eval()
        step.variant = spec.variant
        traces[spec.key] = (clocks[spec.key]("trace_s", trace_step, step), step)
    shared("weights_s", assign_value_free_weights_, model)
    together = [s.key for s in group]
    for i, spec in enumerate(group):
        clock = clocks[spec.key]
        base = (done + i) / total
        traced, step = traces.pop(spec.key)
        emit(base + 0.15 / total, "convert", f"converting {spec.variant} with value-free weights")
        prog = clock("convert_s", to_program, traced, step, keep_duplicate_consts=untied)
        del traced
        if plan is not None:
            emit(base + 0.6 / total, "compress", f"laying out the compressed weights: {spec.compression}")
            clock("compress_s", compress_program, prog, plan, out_dirs[spec.key])
        emit(base + 0.8 / total, "walk", "walking the value-free program (no package is written)")
        program = clock("walk_s", walk_program, prog, out_dirs[spec.key])
        del prog
        equivalence = clock("equivalence_wait_s", equivalences.result, spec)
        yield spec, _document(spec, geometry, program, clock, shared.timings, equivalence, untied, together, None)


def _materialised_group(group: list[BuildSpec], out_dirs, equivalences: _Equivalences, done: int, total: int):
    """Builds with weight values (a runnable package): one fp16 model, then per build trace → ct.convert →
    optional coremltools.optimize compression → save → walk."""
    import torch

    from analyzer.graph.mil import read_program
    from analyzer.model.decode import DecodeStep, build_model, untie_embeddings_
    from analyzer.model.sources import geometry_of, load_config

    src = group[0].source
    geometry = geometry_of(load_config(src))
    shared = _Clock()
    weights = "safetensors weights" if src.has_real_weights else f"seeded random weights, seed {src.seed}"
    emit(0.02, "model", _describe(src, geometry, f"{weights}, fp16"))
    model = shared("model_s", build_model, src, torch.float16)
    plan = _plan(group[0], geometry.num_layers)
    untied = False
    if plan is not None:
        from analyzer.build.compress import needs_untie

        if needs_untie(plan) and untie_embeddings_(model):
            untied = True
            emit(0.04, "compress", "embedding and lm_head get different precisions: untied them")
    together = [s.key for s in group]
    for i, spec in enumerate(group):
        clock = _Clock()
        base = (done + i) / total
        step = DecodeStep(model, spec.ctx, spec.variant, spec.kv_mode).eval()
        emit(base + 0.1 / total, "convert", f"tracing and converting ({spec.variant}, KV as {spec.kv_mode}, "
             f"ctx {spec.ctx})")
        mlmodel = clock("convert_s", convert_step, step, keep_duplicate_consts=untied)
        del step
        if plan is not None:
            from analyzer.build.compress import compress_model

            emit(base + 0.6 / total, "compress", f"compressing weights: {spec.compression}")
            mlmodel = clock("compress_s", compress_model, mlmodel, plan)
        emit(base + 0.8 / total, "save", "saving the .mlpackage")
        pkg = out_dirs[spec.key] / PACKAGE_NAME
        clock("save_s", mlmodel.save, str(pkg))
        del mlmodel
        emit(base + 0.9 / total, "walk", "walking the saved MIL program")
        program = clock("walk_s", read_program, pkg)
        equivalence = clock("equivalence_wait_s", equivalences.result, spec)
        yield spec, _document(spec, geometry, program, clock, shared.timings, equivalence, untied, together, pkg)


# ------------------------------------------------------------------------------------------------- process
class _QueueEntry:
    """A file in ``builds/.queue`` so every session can show what is queued or converting."""

    def __init__(self, root: Path, key: str):
        self.path = root / ".queue" / f"{key}.{os.getpid()}.json"
        self.path.parent.mkdir(exist_ok=True)
        self.key = key
        self.since = time.time()

    def set(self, state: str) -> None:
        write_json_atomic(self.path, {"key": self.key, "pid": os.getpid(), "state": state, "since": self.since})

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def read_request(request: Path) -> list[BuildSpec]:
    """A request file: one spec (``BuildSpec.to_json``) or ``{"specs": [spec, ...]}``."""
    data = json.loads(request.read_text())
    return [BuildSpec.from_json(d) for d in (data["specs"] if "specs" in data else [data])]


def run(request: Path, root: Path) -> int:
    from filelock import FileLock, Timeout

    specs = list({s.key: s for s in read_request(request)}.values())
    (root / ".locks").mkdir(parents=True, exist_ok=True)
    entries = {s.key: _QueueEntry(root, s.key) for s in specs}
    try:
        with ExitStack() as stack:
            for key in sorted(entries):  # one order for every process: no lock cycles
                stack.enter_context(FileLock(str(root / ".locks" / f"{key}.lock")))
            todo = [s for s in specs if not is_complete(root / s.key)]
            for s in specs:
                if s not in todo:
                    emit(1.0, "done", f"reusing {root / s.key}")
            if not todo:
                return 0
            clean_stale_tmp(root)
            for s in todo:
                entries[s.key].set("queued")
            slot = FileLock(str(root / ".locks" / "convert.lock"))
            while True:
                try:
                    slot.acquire(timeout=5)
                    break
                except Timeout:
                    emit(0.0, "queued", "waiting: another conversion is running on this machine")
            tmps = {s.key: root / f".tmp-{s.key}-{os.getpid()}" for s in todo}
            try:
                for s in todo:
                    entries[s.key].set("running")
                    tmps[s.key].mkdir()
                for spec, analysis in build_all(todo, tmps, root / ".equivalence"):
                    tmp = tmps.pop(spec.key)
                    analysis["timings"]["total_s"] = round(time.monotonic() - _T0, 3)
                    (tmp / ANALYSIS_FILE).write_text(json.dumps(analysis, separators=(",", ":")))
                    (tmp / LOG_FILE).write_text("\n".join(_LOG) + "\n")
                    os.rename(tmp, root / spec.key)  # the one step that makes the build look finished
                    entries[spec.key].remove()
                    emit((len(todo) - len(tmps)) / len(todo), "done", str(root / spec.key))
            finally:
                for tmp in tmps.values():
                    shutil.rmtree(tmp, ignore_errors=True)
                slot.release()
    finally:
        for entry in entries.values():
            entry.remove()
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
