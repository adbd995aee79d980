"""One full-size decode step in the NumPy MIL interpreter: EXAONE 4.0 1.2B (30 layers, 32/8 heads, ctx 4096,
KV as state, fp16), the default preset's repeat_kv build. Goal (issue #9): one step in under 30 s on this machine,
load included.

usage: PYTHONPATH=. python bench/interpret_full_size.py [--builds-dir DIR | --package PKG] [--variant V] [--steps N]
The build is reused when it exists (else converted once: ~15 GB, minutes; run under
``flock /tmp/qfold-fullsize.lock``). Writes bench/results/interpret_full_size.json (or --out): import, load and
per-step wall and CPU seconds, peak RSS, the machine's CPU count, RAM and load average (other processes share
these cores, so wall time depends on them; CPU seconds much less).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 30.0  # issue #9: one full-size decode step in under 30 s


def _package(args) -> Path:
    if args.package:
        return Path(args.package)
    from analyzer.convert.launch import run_build
    from analyzer.model.sources import DEFAULT_PRESET, resolve_source
    from analyzer.model.spec import BuildSpec

    spec = BuildSpec(resolve_source(DEFAULT_PRESET), args.variant, "state", 4096)
    return run_build(spec, args.builds_dir, on_progress=lambda p: print(
        f"[{p.fraction * 100:3.0f}%] {p.stage}: {p.message}", file=sys.stderr, flush=True)).path


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--builds-dir", default=None)
    p.add_argument("--package", default=None, help="a full-size .mlpackage or build folder (skips the build lookup)")
    p.add_argument("--variant", default="repeat_kv")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "interpret_full_size.json"))
    a = p.parse_args()
    import numpy as np
    import psutil

    load_avg_before = os.getloadavg()
    t = time.monotonic()
    import coremltools  # noqa: F401  (the protobuf reader; imported by load_interpreter anyway)

    from analyzer.engines.interpret import decode_steps, load_interpreter

    import_s = time.monotonic() - t
    package = _package(a)
    t, c = time.monotonic(), time.process_time()
    interp = load_interpreter(package)
    load_s, load_cpu_s = time.monotonic() - t, time.process_time() - c

    steps: list[dict] = []
    mark = [time.monotonic(), time.process_time()]

    def on_step(i, result):
        now, cpu = time.monotonic(), time.process_time()
        logits = result.outputs["logits"].astype(np.float32)
        steps.append({"step": i, "wall_s": round(now - mark[0], 3), "cpu_s": round(cpu - mark[1], 3),
                      "logits_finite": bool(np.isfinite(logits).all()), "max_abs_logit": float(np.abs(logits).max())})
        print(json.dumps(steps[-1]), file=sys.stderr, flush=True)
        mark[:] = [time.monotonic(), time.process_time()]

    run = decode_steps(interp, a.steps, seed=0, on_step=on_step)
    weights = interp.path / "Data" / "com.apple.CoreML" / "weights" / "weight.bin"
    first = load_s + steps[0]["wall_s"]
    result = {
        "package": str(package), "variant": a.variant, "weight_bin_bytes": weights.stat().st_size,
        "ops_non_const": interp.op_count, "states": len(interp.states), "tokens": run.tokens[:, 0].tolist(),
        "import_s": round(import_s, 3), "load_s": round(load_s, 3), "load_cpu_s": round(load_cpu_s, 3),
        "steps": steps, "load_plus_first_step_s": round(first, 3),
        "steady_step_wall_s": min(s["wall_s"] for s in steps[1:]) if len(steps) > 1 else None,
        "goal_s": GOAL_S, "meets_goal": first < GOAL_S,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "machine": {"cpu_count": os.cpu_count(), "ram_bytes": psutil.virtual_memory().total,
                    "cpu": platform.processor() or platform.machine(), "python": platform.python_version(),
                    "numpy": np.__version__, "load_avg_1m_before": round(load_avg_before[0], 2),
                    "load_avg_1m_after": round(os.getloadavg()[0], 2)},
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("load_s", "load_plus_first_step_s", "steady_step_wall_s",
                                             "meets_goal", "peak_rss_bytes")}))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
