"""Core AI on Apple's own runtime (issue 19): repeat_kv vs Q-fold measured, not predicted, and what a full-size
Core AI build costs. One run does both; the heavy parts hold the machine-wide lock themselves
(``/tmp/qfold-heavy.lock``, the lock ``flock(1)`` takes):

    PYTHONPATH=. .venv/bin/python bench/coreai.py [--rounds 5] [--steps 4] [--skip-full | --skip-attention]
                                                  [--run-full] [--results PATH]

``attention``: the default preset's attention geometry (EXAONE 4.0 1.2B: 32 query / 8 KV heads, head dim 64) with
2 decoder layers, hidden 256, vocab 1000, fp32 weights (``--weights fp32``: the Linux runtime's fp16 matmul kernel
swamps everything else, probe/coreai/RESULTS.md Q4; such a build keeps its KV state in fp32 too,
``BuildSpec.kv_dtype``, and like every Core AI build stores linear weights ``[in, out]``,
``analyzer.model.linear_layout``), built with ``build --backend coreai`` at ctx 256 and 2048
(repeat_kv, qfold and sdpa_gqa), then all six build folders timed by ``analyzer.measure.bench`` in ONE runtime child:
rounds interleave every target, so the ratios come from one run. Each round is ``--steps`` decode steps from zeroed
states; the figure is the median round. The per-op profile gives each variant's time by byte category.

``full``: ``build --backend coreai --variant qfold`` of the full-size default preset (30 layers, ctx 4096, fp16
weights, materialised: Core AI builds always are), wall time and the peak RSS of the whole process tree (the build
child and the walker's child), sampled every 0.1 s. ``--run-full`` adds one decode step of it on the runtime
(``run BUILD --steps 1``; fp16 weights: ~1 min on this runtime).

Results are written to bench/results/coreai.json (``--results``: elsewhere, e.g. for a smoke run with
``--rounds 1 --steps 1``) with the machine's CPU, memory and load average.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from fast import TreeRss, machine  # bench/fast.py: the same tree-RSS sampler and machine record

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.measure.bench import run_bench  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "coreai.json"
LOCK = "/tmp/qfold-heavy.lock"
SMALL = ("hidden_size=256", "intermediate_size=512", "vocab_size=1000", "num_hidden_layers=2")
VARIANTS = ("repeat_kv", "qfold", "sdpa_gqa")
CTXS = (256, 2048)
GB = 1e9


@contextmanager
def heavy_lock():
    with open(LOCK, "w") as f:
        t0 = time.monotonic()
        fcntl.flock(f, fcntl.LOCK_EX)
        print(f"  (waited {time.monotonic() - t0:.0f} s for {LOCK})", flush=True)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(builds: Path, variants, ctx: int, weights: str, overrides=()) -> list[Path]:
    """``python -m analyzer build --backend coreai``: one folder per variant (the stdout lines that are paths)."""
    argv = [sys.executable, "-m", "analyzer", "build", "--backend", "coreai", "--weights", weights, "--ctx",
            str(ctx), "--variant", *variants, "--builds-dir", str(builds)]
    for o in overrides:
        argv += ["--set", o]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if proc.returncode != 0:
        raise SystemExit(f"build failed: {proc.stderr.strip().splitlines()[-1:]}")
    folders = [Path(line) for line in proc.stdout.splitlines() if line.startswith("/") and Path(line).is_dir()]
    return folders[-len(variants):]


def attention(builds: Path, rounds: int, steps: int) -> dict:
    paths, labels = [], []
    t0 = time.monotonic()
    for ctx in CTXS:
        for variant, folder in zip(VARIANTS, build(builds, VARIANTS, ctx, "fp32", SMALL), strict=True):
            paths.append(folder)
            labels.append(f"{variant} ctx {ctx}")
    t_build = time.monotonic() - t0
    result = run_bench(paths, labels, steps=steps, rounds=rounds, warmup=1)
    by = {t.label: t for t in result.targets}
    out: dict = {"geometry": "EXAONE 4.0 1.2B attention (32 q / 8 KV heads, head dim 64), 2 layers, hidden 256, "
                             "vocab 1000, fp32 weights and KV state",
                 "rounds": rounds, "steps_per_round": steps, "build_s": round(t_build, 1),
                 "device": result.machine.device, "ctx": {}}
    for ctx in CTXS:
        base = by[f"repeat_kv ctx {ctx}"]
        row = {}
        for v in VARIANTS:
            t = by[f"{v} ctx {ctx}"]
            row[v] = {"ms_per_step_median": round(t.ms_per_token_median, 3),
                      "ms_per_step_range": [round(1e3 / max(t.tok_per_s), 3), round(1e3 / min(t.tok_per_s), 3)],
                      "tok_per_s_median": round(t.tok_per_s_median, 3),
                      "ratio_to_repeat_kv": round(t.ms_per_token_median / base.ms_per_token_median, 3),
                      "profiled_ms_by_category": {k: round(x, 3) for k, x in t.time_by_category_ms.items() if x},
                      "build": t.build_key}
        out["ctx"][str(ctx)] = row
        print(f"  ctx {ctx}: " + ", ".join(f"{v} {row[v]['ms_per_step_median']:.1f} ms "
                                           f"(×{row[v]['ratio_to_repeat_kv']:.2f})" for v in VARIANTS), flush=True)
    out["qfold_over_repeat_kv_ctx2048"] = out["ctx"]["2048"]["qfold"]["ratio_to_repeat_kv"]
    out["within_0_5"] = out["qfold_over_repeat_kv_ctx2048"] <= 0.5
    return out


def full(builds: Path, run_step: bool) -> dict:
    fresh = Path(tempfile.mkdtemp(prefix="full-", dir=builds))  # never a cached build: the conversion is measured
    try:
        return _full(fresh, run_step)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)  # a 2.56 GB asset


def _full(builds: Path, run_step: bool) -> dict:
    with TreeRss() as rss:
        t0 = time.monotonic()
        folder = build(builds, ("qfold",), 4096, "fp16")[0]
        wall = time.monotonic() - t0
    doc = json.loads((folder / "analysis.json").read_text())
    asset = folder / "model.aimodel"
    out = {"what": "build --backend coreai --variant qfold, full-size exaone-4.0-1.2b, ctx 4096, fp16 weights",
           "wall_s": round(wall, 1), "tree_peak_rss_bytes": rss.peak_bytes,
           "max_process_rss_bytes": rss.max_process_bytes, "within_8_gb": rss.peak_bytes <= 8 * GB,
           "asset_bytes": sum(f.stat().st_size for f in asset.rglob("*") if f.is_file()),
           "timings_s": doc.get("timings", {}), "key": doc.get("key")}
    print(f"  full-size build: {wall:.0f} s, tree peak RSS {rss.peak_bytes / GB:.2f} GB", flush=True)
    if run_step:
        with TreeRss() as rss2:
            t1 = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "analyzer", "run", str(folder), "--steps", "1", "--out",
                                   str(builds / "full_step.npz")], cwd=ROOT, capture_output=True, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)))
            out["run_one_step"] = {"wall_s": round(time.monotonic() - t1, 1), "tree_peak_rss_bytes": rss2.peak_bytes,
                                   "stdout": proc.stdout.strip()[-300:], "returncode": proc.returncode}
        print(f"  one decode step on the runtime: {out['run_one_step']}", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--builds-dir", default="/tmp/qfold-bench-coreai-builds")
    p.add_argument("--skip-full", action="store_true")
    p.add_argument("--skip-attention", action="store_true")
    p.add_argument("--run-full", action="store_true", help="also run one decode step of the full-size build")
    p.add_argument("--results", type=Path, default=RESULTS, help=f"the JSON to update (default {RESULTS})")
    args = p.parse_args()
    builds = Path(args.builds_dir)
    builds.mkdir(parents=True, exist_ok=True)
    results: Path = args.results
    data = json.loads(results.read_text()) if results.is_file() else {}
    if not args.skip_attention:
        with heavy_lock():
            print("attention A/B on the Core AI runtime", flush=True)
            data["attention"] = attention(builds, args.rounds, args.steps)
            data["machine"] = machine()
    if not args.skip_full:
        with heavy_lock():
            print("full-size Core AI Q-fold build", flush=True)
            data["full_size"] = full(builds, args.run_full)
            data["machine_full"] = machine()
    results.parent.mkdir(parents=True, exist_ok=True)
    latest = json.loads(results.read_text()) if results.is_file() else {}
    results.write_text(json.dumps({**latest, **data}, indent=1) + "\n")  # a part run alone keeps the other
    print(f"wrote {results}")


if __name__ == "__main__":
    main()
