"""Where a Core AI build's time goes (issue 40, item 1), as bench/profile_build.py does for Core ML: one variant's
stages run in this process, each timed in CPU seconds, and the functions inside them that grow with layers or
weights timed by name. Run full-size profiles under the machine-wide lock:

    flock /tmp/qfold-fullsize.lock env PYTHONPATH=. .venv/bin/python -P bench/profile_coreai_build.py
    ... bench/profile_coreai_build.py --set num_hidden_layers=8 --mode materialised --label before
    ... bench/profile_coreai_build.py --set num_hidden_layers=8 --cprofile 30      (hot functions)
    ... bench/profile_coreai_build.py --set num_hidden_layers=8 --full-path      (no shortcut: what they save)

Stages, as ``analyzer.convert.coreai_build`` runs them: the model (``model_s``: value-free, or seeded fp16/fp32
weights), ``torch.export`` (``export_s``), ``run_decompositions(coreai_torch.get_decomp_table())``
(``decompose_s``), coreai-torch's lowering (``lower_s``: ``TorchConverter.add_exported_program`` +
``to_coreai``), the save (``save_s``) and the walk of the saved asset (``walk_s``). Within them, exclusive CPU
seconds (a timed function's time minus the timed functions it called) of:

* ``graph_module_recompile``: ``torch.fx.GraphModule.recompile`` (Python code of a graph nobody calls as Python),
  in every stage;
* ``validate_exported_program``: coreai-torch's check that every op has a lowering;
* ``constant_from_tensor``: one ``coreai.constant`` per weight, buffer and constant (a one-value weight is made
  contiguous, i.e. materialised, before MLIR finds it a splat);
* ``debug_info``: the recorder's per-op bookkeeping (call stacks, op ids) and its final pass;
* ``pre_compilation_rewrite``: coreai-core's rewrite passes when the module is finished;
* ``serialize_bytecode`` and ``bytecode_hash`` (the save re-reads the whole bytecode to hash it);
* ``mlir_dump``: the walk's read of the asset's MLIR (here in this process: the build does it in a child, whose
  CPU time is not this process's).

The rest of a stage is its ``other``. CPU seconds (``time.process_time``: what other work on the machine does not
inflate); the stages' wall seconds beside them. Results are merged into bench/results/profile_coreai_build.json
(key: preset, overrides, ctx, variant, mode, ``--label``) with the machine's CPU count, memory and load average.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.fast import code_commit, machine  # noqa: E402  (the sibling bench script: one record of each)

RESULTS = ROOT / "bench" / "results" / "profile_coreai_build.json"


class Timers:
    """Exclusive CPU seconds per key: a timed function's time minus that of the timed functions it called."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[list] = []  # [key, start, time spent in timed callees]

    def wrap(self, key: str, fn):
        def timed(*args, **kwargs):
            self._stack.append([key, time.process_time(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                k, start, inner = self._stack.pop()
                spent = time.process_time() - start
                self.seconds[k] += spent - inner
                self.calls[k] += 1
                if self._stack:
                    self._stack[-1][2] += spent
        return timed


@contextlib.contextmanager
def patched(timers: Timers):
    """Time the named functions (see the module docstring) by wrapping them where their callers look them up;
    everything is restored on exit."""
    import coreai.authoring.asset as asset_mod
    import coreai.authoring.module as module_mod
    import coreai_torch._debug_locations as dbg
    import coreai_torch.converter as conv
    from torch.fx import GraphModule

    import analyzer.ir.coreai.mlir_dump as dump_mod

    targets = [
        (GraphModule, "recompile", "graph_module_recompile"),
        (conv, "validate_exported_program", "validate_exported_program"),
        (conv.TorchConverter, "_constant_from_tensor", "constant_from_tensor"),
        (dbg._DebugInfoRecorder, "record_operation", "debug_info"),
        (dbg._DebugInfoRecorder, "finalize_node_operations", "debug_info"),
        (module_mod, "run_pre_compilation_rewrite", "pre_compilation_rewrite"),
        (asset_mod, "_serialize_module_to_bytecode", "serialize_bytecode"),
        (asset_mod.hashlib, "sha256", "bytecode_hash"),
        (dump_mod, "dump_module", "mlir_dump"),
    ]
    originals = [(owner, name, owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name))
                 for owner, name, _ in targets]
    try:
        for (owner, name, key), (_, _, fn) in zip(targets, originals, strict=True):
            if isinstance(fn, staticmethod):
                setattr(owner, name, staticmethod(timers.wrap(key, fn.__func__)))
            elif name == "record_operation":  # a context manager: time entering and leaving it
                setattr(owner, name, _timed_cm(timers, key, fn))
            else:
                setattr(owner, name, timers.wrap(key, fn))
        yield
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)


def _timed_cm(timers: Timers, key: str, fn):
    """A context-manager method timed while it is entered and left (not while its body runs)."""
    @contextlib.contextmanager
    def cm(self, *args):
        manager = fn(self, *args)
        value = timers.wrap(key, manager.__enter__)()
        try:
            yield value
        except BaseException as e:
            if not manager.__exit__(type(e), e, e.__traceback__):
                raise
        else:
            timers.wrap(key, manager.__exit__)(None, None, None)
    return cm


def profile(preset: str, overrides: list[str], ctx: int, variant: str, mode: str, weights: str, full_path: bool,
            top: int) -> dict:
    """One Core AI build's stages in this process (see the module docstring)."""
    from analyzer import quiet_coremltools

    quiet_coremltools()
    import coreai.authoring  # noqa: F401  (before coreai._compiler.dialects)
    import torch

    from analyzer.convert import coreai_build
    from analyzer.convert.coreai_quick import one_value_converter
    from analyzer.convert.modes import make_step
    from analyzer.ir.coreai.mlir_dump import dump_asset
    from analyzer.ir.coreai.walk import program_from_dump
    from analyzer.model.sources import load_config, resolve_source
    from analyzer.model.spec import BuildSpec

    torch.set_num_threads(max(1, os.cpu_count() or 1))  # as the conversion child
    source = resolve_source(preset, overrides)
    spec = BuildSpec(source, variant, "state", ctx, build_mode=mode, backend="coreai", weights=weights)
    timers, wall, cpu = Timers(), {}, {}
    prof = cProfile.Profile() if top else None

    def stage(name: str, fn, *args):
        gc.collect()
        t, c = time.perf_counter(), time.process_time()
        if prof:
            prof.enable()
        try:
            return fn(*args)
        finally:
            if prof:
                prof.disable()
            wall[name], cpu[name] = round(time.perf_counter() - t, 3), round(time.process_time() - c, 3)

    scratch = Path(tempfile.mkdtemp(prefix="qfold-coreai-profile-"))
    converter = None if full_path else one_value_converter()
    try:
        with patched(timers):
            model, _ = stage("model_s", coreai_build.model_for, spec)
            step = make_step(model, spec, "decode", lazy_cache=mode == "analysis")
            ep = stage("export_s", coreai_build.export_only, step)
            ep = stage("decompose_s", coreai_build.decompose, ep)
            program = stage("lower_s", coreai_build.to_program, ep, step, converter)
            del ep, step, model
            asset = scratch / "model.aimodel"
            stage("save_s", coreai_build.save_asset, program, asset)
            del program
            doc = stage("walk_s", dump_asset, asset)
            walked = program_from_dump(doc, str(asset), "coreai")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    by_stage_keys = {k: round(v, 3) for k, v in sorted(timers.seconds.items(), key=lambda kv: -kv[1])}
    cfg = load_config(source)
    row = {"preset": preset, "overrides": overrides, "ctx": ctx, "variant": variant, "mode": mode,
           "weights": weights, "num_layers": cfg.num_hidden_layers, "shortcuts": not full_path,
           "stages_cpu_s": cpu, "stages_wall_s": wall, "cpu_s": round(sum(cpu.values()), 3),
           "functions_cpu_s": by_stage_keys, "function_calls": dict(timers.calls),
           "total_ops": len(walked.ops),
           "peak_rss_self_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if prof:
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
        row["hot_functions_tottime"] = [ln.rstrip() for ln in text.getvalue().splitlines() if ln.strip()][-top - 1:]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="exaone-4.0-1.2b")
    p.add_argument("--set", action="append", default=[], dest="overrides", help="config override, as `build --set`")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--variant", default="qfold")
    p.add_argument("--mode", choices=("analysis", "materialised"), default="analysis")
    p.add_argument("--weights", choices=("fp16", "fp32"), default="fp16")
    p.add_argument("--full-path", action="store_true", help="no shortcut (analyzer.convert.coreai_quick): the full "
                   "path, to measure what the shortcuts save")
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="also record the N hottest functions")
    p.add_argument("--label", default="", help="appended to the result key (e.g. before/after a change)")
    p.add_argument("--no-save", action="store_true", help="print, do not merge into the results file")
    a = p.parse_args()
    start, commit = machine(), code_commit()
    row = profile(a.preset, a.overrides, a.ctx, a.variant, a.mode, a.weights, a.full_path, a.cprofile)
    row.update(when=time.strftime("%Y-%m-%d %H:%M:%S"), machine_at_start=start, machine_at_end=machine(),
               cprofiled=bool(a.cprofile), code_commit=commit)
    key = "-".join([a.preset, *a.overrides, f"ctx{a.ctx}", a.variant, a.mode, a.weights,
                    *(["full-path"] if a.full_path else []), *([a.label] if a.label else [])])
    if not a.no_save:
        data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
        data[key] = row
        RESULTS.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{key}: {row['cpu_s']:.1f} CPU s, {row['total_ops']} ops, peak {row['peak_rss_self_bytes'] / 1e9:.2f} GB")
    print("  stages (CPU s):", row["stages_cpu_s"])
    print("  stages (wall s):", row["stages_wall_s"])
    print("  functions (exclusive CPU s):", row["functions_cpu_s"])
    for line in row.get("hot_functions_tottime", []):
        print("   ", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
