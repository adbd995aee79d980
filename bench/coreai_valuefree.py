"""Does a Core AI build gain from value-free weights (qfold's analysis mode), as a Core ML build does? (issue 19)

Converts the same decode step (the default preset's Q-fold, KV as state, fp16 torch weights; ``--layers`` of the
full-width model, ctx ``--ctx``) to Core AI twice, each in its own child process, and records wall time, the
child's peak RSS, the saved asset's size, the constant bytes the program holds and its op counts:

* ``materialised``: seeded random fp16 weights (what ``build --backend coreai`` does);
* ``valuefree``: the analysis mode's model (``analyzer.model.valuefree``: zero pages while exporting, then one
  fp16 zero-stride view per tensor) through the same export → coreai-torch → save.

    flock /tmp/qfold-heavy.lock env PYTHONPATH=. .venv/bin/python bench/coreai_valuefree.py [--layers 4]

Results in bench/results/coreai_valuefree.json, one top-level entry per layer count and ctx (a new run of the same
layers and ctx replaces its entry, the others are kept).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "coreai_valuefree.json"


def child(mode: str, layers: int, ctx: int, out: Path) -> None:
    """One conversion in this process; prints one JSON line."""
    import coreai.authoring  # noqa: F401  (before coreai._compiler.dialects)
    import torch

    from analyzer.analysis.record import Analysis
    from analyzer.convert.coreai_build import export_step, save_asset, to_program
    from analyzer.ir.coreai.walk import read_asset
    from analyzer.model.decode import DecodeStep, build_model
    from analyzer.model.sources import DEFAULT_PRESET, resolve_source
    from analyzer.model.valuefree import assign_value_free_weights_, build_value_free_model

    source = resolve_source(DEFAULT_PRESET, [f"num_hidden_layers={layers}"])
    t0 = time.monotonic()
    if mode == "valuefree":
        model = build_value_free_model(source)
        step = DecodeStep(model, ctx, "qfold", "state", lazy_cache=True).eval()
        assign_value_free_weights_(model)
    else:
        model = build_model(source, torch.float16)
        step = DecodeStep(model, ctx, "qfold", "state").eval()
    t_model = time.monotonic() - t0
    ep = export_step(step)
    t_export = time.monotonic() - t0 - t_model
    program = to_program(ep, step)
    t_convert = time.monotonic() - t0 - t_model - t_export
    del ep, step, model  # as the build does (analyzer.convert.coreai_build): no torch copy alive at the save
    gc.collect()
    save_asset(program, out)
    del program
    t_save = time.monotonic() - t0 - t_model - t_export - t_convert
    a = Analysis(read_asset(out))
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(json.dumps({
        "mode": mode, "layers": layers, "ctx": ctx, "model_s": round(t_model, 2), "export_s": round(t_export, 2),
        "convert_s": round(t_convert, 2), "save_s": round(t_save, 2), "asset_bytes": size,
        "const_bytes": sum(op.const_bytes for op in a.program.ops), "total_ops": a.summary.total_ops,
        "weights_per_token": a.bytes_per_token.weights,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--child", choices=("materialised", "valuefree"))
    p.add_argument("--out")
    args = p.parse_args()
    if args.child:
        child(args.child, args.layers, args.ctx, Path(args.out))
        return
    runs = []
    for mode in ("materialised", "valuefree"):
        with tempfile.TemporaryDirectory() as d:
            t = time.monotonic()
            # -P: no bench/ on the child's sys.path, where bench/coreai.py would shadow the coreai package
            proc = subprocess.run([sys.executable, "-P", __file__, "--child", mode, "--layers", str(args.layers),
                                   "--ctx", str(args.ctx), "--out", str(Path(d) / "m.aimodel")],
                                  capture_output=True, text=True)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                runs.append({"mode": mode, "failed": (proc.stderr.strip().splitlines() or ["?"])[-1][:300]})
            else:
                runs.append({**json.loads(lines[-1]), "wall_s": round(time.monotonic() - t, 1)})
        print(json.dumps(runs[-1]), flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    doc = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    doc[f"{args.layers} layers, ctx {args.ctx}"] = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_avg": os.getloadavg()},
        "spec": f"{args.layers} layers of the default preset, Q-fold, KV state, ctx {args.ctx}, fp16 torch weights",
        "runs": runs}
    RESULTS.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
