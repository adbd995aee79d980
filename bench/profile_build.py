"""Where an analysis-mode A/B's time goes (issue 23, item 1): the stages of ``build --variant repeat_kv qfold``
run one after the other in this process, each timed, and every coremltools pass timed by its pipeline's own
pass name. Run it under the machine-wide lock:

    flock /tmp/qfold-heavy.lock env PYTHONPATH=. .venv/bin/python bench/profile_build.py
    flock /tmp/qfold-heavy.lock env PYTHONPATH=. .venv/bin/python bench/profile_build.py --preset llama-3.1-70b
    ... bench/profile_build.py --preset llama-3.1-70b --set num_hidden_layers=4 --cprofile 25   (hot functions)

Stages, as ``analyzer.convert.modes.value_free_programs`` runs them for each variant (the function an analysis-mode
build calls, here called for one variant after the other): the value-free model (``build_model_s``), the trace
(``trace_s``), the weights made value-free views (``weights_s``), ``to_program`` (``convert_s``) = coremltools'
torch frontend (``frontend_init_s``: TorchScript inlining and lowering, ``TorchConverter.__init__``;
``frontend_ops_s``: torch nodes → MIL ops, ``TorchConverter.convert``), the ``frontend_pytorch``, ``default`` (main)
and ``backend_mlprogram`` pass pipelines pass by pass, then qfold's skeleton export + walk (``walk_s``); finally
the variants' torch equivalence check on the reduced model (``equivalence_s``; in a real build it runs in a
worker process beside the conversions). Profiles labelled ``before`` ran an earlier version of the same stages
(commit b13f3d1: one model for both variants, traced one after the other before either converted).

How passes are timed, without patching any file: for the duration of the run only, ``PassPipelineManager.
apply_pipeline`` (coremltools 9.0, ``mil/passes/pass_pipeline.py``) is wrapped to note which pipeline runs, and
``PassRegistry.__getitem__`` (which ``apply_pipeline`` calls once per pass to get a fresh pass instance) to hand
back the instance behind a timer; ``Program.validate``, which ``apply_pipeline`` calls after every pass, is
timed per pipeline as ``<pipeline>/validate``. A pass that runs several times in one pipeline is summed. Passes,
validations and the frontend are timed in CPU seconds of this process (``time.process_time``: what other work on
the machine does not inflate; profiles from before 2026-12-02 07:30 timed them in wall seconds); the stages
(``*_s`` of ``value_free_programs``) in wall seconds, ``cpu_s`` the CPU seconds of a variant's stages.
Results are merged into bench/results/profile_build.json (key: preset, overrides, ctx and ``--label``) with the
machine's CPU count, memory and load average; this run's process is alone in being measured, but not on the
machine: read the load average beside every figure.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import pstats
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.fast import code_commit, machine  # noqa: E402  (the sibling bench script: one record of each)

RESULTS = ROOT / "bench" / "results" / "profile_build.json"


class _TimedPass:
    """A pass instance behind a timer: ``apply_pipeline`` calls ``set_options`` then the instance."""

    def __init__(self, graph_pass, key: str, into: dict[str, float]):
        self._graph_pass, self._key, self._into = graph_pass, key, into

    def __getattr__(self, name):
        return getattr(self._graph_pass, name)

    def __call__(self, prog):
        t = time.process_time()
        try:
            return self._graph_pass(prog)
        finally:
            self._into[self._key] += time.process_time() - t


@contextlib.contextmanager
def timed_coremltools(into: dict[str, float]):
    """Time coremltools' frontend, every pass (``<pipeline>/<namespace::pass>``) and every validation, adding
    seconds into ``into``; everything is restored on exit."""
    from coremltools.converters.mil.frontend.torch.converter import TorchConverter
    from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipelineManager
    from coremltools.converters.mil.mil.passes.pass_registry import PassRegistry
    from coremltools.converters.mil.mil.program import Program

    current = ["(none)"]
    originals = {(PassPipelineManager, "apply_pipeline"): PassPipelineManager.__dict__["apply_pipeline"],
                 (PassRegistry, "__getitem__"): PassRegistry.__getitem__,
                 (Program, "validate"): Program.validate,
                 (TorchConverter, "__init__"): TorchConverter.__init__,
                 (TorchConverter, "convert"): TorchConverter.convert}
    apply_pipeline = originals[(PassPipelineManager, "apply_pipeline")].__func__

    def timed(key: str, fn):
        def wrapper(*args, **kwargs):
            t = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                into[key] += time.process_time() - t
        return wrapper

    def apply(prog, pipeline):
        outer, current[0] = current[0], str(pipeline)
        try:
            return timed(f"pipeline:{pipeline}", apply_pipeline)(prog, pipeline)
        finally:
            current[0] = outer

    def get(self, pass_id):
        return _TimedPass(originals[(PassRegistry, "__getitem__")](self, pass_id), f"{current[0]}/{pass_id}", into)

    def validate(self, *args, **kwargs):
        return timed(f"{current[0]}/validate", originals[(Program, "validate")])(self, *args, **kwargs)

    PassPipelineManager.apply_pipeline = staticmethod(apply)
    PassRegistry.__getitem__ = get
    Program.validate = validate
    TorchConverter.__init__ = timed("frontend_init", originals[(TorchConverter, "__init__")])
    TorchConverter.convert = timed("frontend_ops", originals[(TorchConverter, "convert")])
    try:
        yield
    finally:
        for (owner, name), fn in originals.items():
            setattr(owner, name, fn)


def _rounded(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in sorted(d.items(), key=lambda kv: -kv[1])}


def _pipelines(times: dict[str, float]) -> dict:
    """``{pipeline: {total_s, validate_s, passes_s: {pass: s}}}`` from the flat timer keys."""
    out: dict[str, dict] = {}
    for key, s in times.items():
        if key.startswith("pipeline:"):
            out.setdefault(key[9:], {})["total_s"] = round(s, 3)
    for key, s in times.items():
        pipeline, _, name = key.partition("/")
        if not name:
            continue
        entry = out.setdefault(pipeline, {})
        if name == "validate":
            entry["validate_s"] = round(s, 3)
        else:
            entry.setdefault("passes_s", {})[name] = round(s, 3)
    for entry in out.values():
        entry["passes_s"] = _rounded(entry.get("passes_s", {}))
    return out


def _hot_functions(profile: cProfile.Profile, top: int) -> list[str]:
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    return [ln.rstrip() for ln in text.getvalue().splitlines() if ln.strip()][-top - 1:]


def profile(preset: str, overrides: list[str], ctx: int, variants: list[str], top: int) -> dict:
    """One A/B's stages in this process, one variant after the other, through the analysis mode's own
    ``value_free_programs`` (see the module docstring)."""
    from analyzer import quiet_coremltools

    quiet_coremltools()
    import torch

    from analyzer.convert.checks import check_reduced_equivalence
    from analyzer.convert.modes import value_free_programs
    from analyzer.model.sources import resolve_source
    from analyzer.model.spec import ANALYSIS_MODE, BuildSpec

    torch.set_num_threads(max(1, os.cpu_count() or 1))  # as the conversion child
    source = resolve_source(preset, overrides)
    specs = {v: BuildSpec(source, v, "state", ctx, build_mode=ANALYSIS_MODE) for v in variants}
    per_variant: dict[str, dict] = {}
    t_all = time.perf_counter()
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / f"qfold-profile-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    hot = {}
    for v in variants:
        print(f"{v}: model, trace, convert, walk", flush=True)
        times: dict[str, float] = defaultdict(float)
        prof = cProfile.Profile() if top else None
        cpu = time.process_time()
        with timed_coremltools(times):
            if prof:
                prof.enable()
            (program,), timings, _ = value_free_programs(specs[v], scratch)
            if prof:
                prof.disable()
        per_variant[v] = {**timings, "cpu_s": round(time.process_time() - cpu, 3),
                          "frontend_init_s": round(times.pop("frontend_init", 0.0), 3),
                          "frontend_ops_s": round(times.pop("frontend_ops", 0.0), 3),
                          "pipelines": _pipelines(times), "total_ops": len(program.ops),
                          "tile_count": len(program.tiles())}
        print(f"  {timings}", flush=True)
        if prof:
            hot[v] = _hot_functions(prof, top)
    scratch.rmdir()
    t = time.perf_counter()
    check_reduced_equivalence(specs[variants[0]].to_json())
    stages = {"equivalence_s": round(time.perf_counter() - t, 3)}
    by_pass: dict[str, float] = defaultdict(float)
    for r in per_variant.values():
        for pipeline, entry in r["pipelines"].items():
            for name, s in entry["passes_s"].items():
                by_pass[f"{pipeline}/{name}"] += s
            by_pass[f"{pipeline}/validate"] += entry.get("validate_s", 0.0)
    from analyzer.model.sources import load_config

    cfg = load_config(source)
    return {"preset": preset, "overrides": overrides, "ctx": ctx, "num_layers": cfg.num_hidden_layers,
            "wall_s": round(time.perf_counter() - t_all, 1),
            "peak_rss_self_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "stages_s": stages, "variants": per_variant, "by_pass_s_both_variants": _rounded(by_pass),
            **({"hot_functions_tottime": hot} if hot else {})}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="exaone-4.0-1.2b")
    p.add_argument("--set", action="append", default=[], dest="overrides", help="config override, as `build --set`")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--variants", default="repeat_kv,qfold")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="also record the N hottest functions "
                   "(cProfile, tottime) of each conversion; slows Python-heavy passes")
    p.add_argument("--label", default="", help="appended to the result key (e.g. before/after a change)")
    a = p.parse_args()
    start, commit = machine(), code_commit()  # the code this process imports now
    row = profile(a.preset, a.overrides, a.ctx, a.variants.split(","), a.cprofile)
    row.update(when=time.strftime("%Y-%m-%d %H:%M:%S"), machine_at_start=start, machine_at_end=machine(),
               cprofiled=bool(a.cprofile), code_commit=commit)
    key = "-".join([a.preset, *a.overrides, f"ctx{a.ctx}", *([a.label] if a.label else [])])
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    data[key] = row
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    print(f"\n{key}: {row['wall_s']:.0f} s in all, stages {row['stages_s']}")
    for v, r in row["variants"].items():
        print(f"  {v}: model {r['build_model_s']:.1f} s, trace {r['trace_s']:.1f} s, convert {r['convert_s']:.1f} s "
              f"(frontend {r['frontend_init_s']:.1f} + {r['frontend_ops_s']:.1f} s), walk {r['walk_s']:.1f} s, "
              f"{r['total_ops']} ops")
    print("slowest passes (both variants):")
    for name, s in list(row["by_pass_s_both_variants"].items())[:15]:
        print(f"  {s:8.2f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
