"""The full-size default on Apple's Core AI runtime (issue 40, item 3): repeat_kv against Q-fold, decode timed on the
Linux runtime (CPU, single-threaded), with the 2-layer figures of the same settings beside it, in one run.

    env PYTHONPATH=. .venv/bin/python bench/coreai_full_size.py [--builds builds/] [--ctx 2048,4096]
        [--weights fp32,fp16] [--only-2-layer]

1. Builds (or reuses, by key, from ``--builds``) the full-size default (30 layers, ctx 2048 and 4096, KV as state) in
   both variants, materialised, with fp32 and with fp16 torch weights (``build --backend coreai --mode materialised
   --weights W``). Each full-size conversion takes this machine's lock, ``/tmp/qfold-fullsize.lock`` (the one
   ``flock`` takes: one full-size conversion at a time on a shared machine), and releases it for the timing.
2. Times decode per ctx and weights on the runtime, rounds alternating between repeat_kv and Q-fold with one model
   resident at a time (:func:`time_pair`: two full-size fp32 models at once would not fit beside other work): fp32
   5 rounds × 4 steps, each after a warmup round; fp16 one round of 4 steps (the Linux runtime's fp16 matmul kernel
   makes a full-size fp16 step take minutes), no warmup. The ratio's interval is ``qfold bench``'s
   (``analyzer.measure.bench.RATIO_METHOD``).
3. The same at the README's 2-layer setting (``TWO_LAYERS``, bench/coreai.py's: the default's attention geometry, 2
   layers, hidden 256, vocab 1000), so the full-size figure stands beside the 2-layer one it replaces as the headline.

Results: ``bench/results/coreai_full_size.json`` (one entry per weights and ctx; a re-run keeps the previous under
``history``), with the machine's CPU count, memory and the load average at the start and end of each timing.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import sys
import time
from pathlib import Path

from fast import TreeRss, _progress, code_commit, machine  # bench/fast.py: one sampler and one machine record

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "bench" / "results" / "coreai_full_size.json"
LOCK = Path("/tmp/qfold-fullsize.lock")
# The README's 2-layer figures (bench/coreai.py SMALL): the default's attention geometry (32 q / 8 KV heads, head
# dim 64) in 2 decoder layers, hidden 256, vocab 1000
TWO_LAYERS = ("hidden_size=256", "intermediate_size=512", "vocab_size=1000", "num_hidden_layers=2")
PLAN = {"fp32": {"rounds": 5, "steps": 4, "warmup": 1},
        "fp16": {"rounds": 1, "steps": 4, "warmup": 0}}


@contextlib.contextmanager
def fullsize_lock():
    """The machine-wide lock ``flock /tmp/qfold-fullsize.lock`` takes (flock(2) on the same file)."""
    with LOCK.open("a") as f:
        print(f"  waiting for {LOCK} ...", flush=True)
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_pair(overrides: list[str], ctx: int, weights: str, root: Path, full_size: bool) -> tuple[dict, dict]:
    """(variant → build folder, what the conversion cost): reused when already in ``root``."""
    from analyzer.convert.launch import is_complete, run_builds
    from analyzer.model.sources import DEFAULT_PRESET, resolve_source
    from analyzer.model.spec import MATERIALISED_MODE, BuildSpec

    source = resolve_source(DEFAULT_PRESET, overrides)
    specs = [BuildSpec(source, v, "state", ctx, build_mode=MATERIALISED_MODE, backend="coreai", weights=weights)
             for v in ("repeat_kv", "qfold")]
    if all(is_complete(root / s.key) for s in specs):
        return {s.variant: root / s.key for s in specs}, {"reused": True}
    lock = fullsize_lock() if full_size else contextlib.nullcontext()
    with lock, TreeRss() as rss:
        t0 = time.monotonic()
        # one child per build: a second materialised Core AI build in the same child peaked at 10.1 GB where the
        # first took 5.9 GB (fp16; builds/*/analysis.json peak_rss_bytes, 2026-12-06), which fp32 would double
        results = [r for s in specs for r in run_builds([s], root, on_progress=_progress(t0))]
        wall = time.monotonic() - t0
    return ({s.variant: r.path for s, r in zip(specs, results, strict=True)},
            {"reused": False, "wall_s": round(wall, 1), "peak_rss_tree_bytes": rss.peak_bytes,
             "load_average_1min_at_end": os.getloadavg()[0]})


def time_pair(builds: dict, weights: str) -> dict:
    """Decode of repeat_kv and Q-fold on the runtime, rounds alternating between them. One model is resident at a
    time: a full-size fp32 asset (5.1 GB) takes ~2.2× its size in the runtime (bench/results/coreai.json: 5.75 GB for
    the 2.56 GB fp16 asset), so two at once would not fit this 24 GB machine beside other work. Each round loads the
    variant in a fresh runtime child (``executable()`` lowers it again: outside the timed calls), runs the warmup
    round(s), then one timed round of ``steps`` decode steps from zeroed states; the peak memory is that child's
    (VmHWM), a process holding only this model. The ratio's interval is ``qfold bench``'s
    (``analyzer.measure.bench.ratio_ci``: each round's two times are paired)."""
    from analyzer.engines.coreai.runtime import CoreAIRuntime, asset_in
    from analyzer.engines.interpret import decode_feeds
    from analyzer.measure.bench import RATIO_METHOD, ratio_ci
    from analyzer.measure.bench import machine as runtime_machine

    plan = PLAN[weights]
    steps, variants = plan["steps"], ("repeat_kv", "qfold")
    load_start = os.getloadavg()
    t0 = time.monotonic()
    round_s: dict[str, list[float]] = {v: [] for v in variants}
    peak: dict[str, int | None] = dict.fromkeys(variants, 0)
    load_s: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(plan["rounds"]):
        for v in variants:
            print(f"  [{time.monotonic() - t0:7.1f} s] round {r + 1} of {plan['rounds']}: {v}", flush=True)
            with CoreAIRuntime() as rt:
                t = time.monotonic()
                m = rt.load(asset_in(builds[v]))
                load_s[v].append(round(time.monotonic() - t, 2))
                feeds = {m.id: decode_feeds(m, steps)}
                if plan["warmup"]:
                    rt.time_decode([m], feeds, 0, plan["warmup"])
                round_s[v].extend(rt.time_decode([m], feeds, 1, 0).round_s[m.id])
                mem = rt.memory()
                peak[v] = None if mem is None or peak[v] is None else max(peak[v], mem[1])
    per_token = {v: [x / steps for x in round_s[v]] for v in variants}
    ms = {v: 1e3 * sorted(per_token[v])[len(per_token[v]) // 2] for v in variants}
    ratio = ratio_ci(tuple(per_token["qfold"]), tuple(per_token["repeat_kv"]))
    m = runtime_machine()
    return {"plan": plan, "device": m.device, "compute_units": m.compute_units,
            "round_s": round_s, "load_s": load_s, "ms_per_token": ms,
            "tok_per_s": {v: 1e3 / ms[v] for v in variants}, "peak_rss_bytes": peak,
            "qfold_over_repeat_kv": {"median": ratio.median, "low": ratio.low, "high": ratio.high,
                                     "level": ratio.level, "rounds": ratio.rounds,
                                     "method": RATIO_METHOD + "; here the rounds alternate between the variants, "
                                               "one model resident at a time"},
            "wall_s": round(time.monotonic() - t0, 1), "load_average_at_start": list(load_start),
            "load_average_at_end": list(os.getloadavg())}


def save(key: str, value: dict) -> None:
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    if key in data:
        data.setdefault("history", {}).setdefault(key, []).append(data[key])
    data[key] = value
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--builds", type=Path, default=ROOT / "builds", help="the builds folder (builds are reused by key)")
    p.add_argument("--ctx", default="2048,4096")
    p.add_argument("--weights", default="fp32,fp16")
    p.add_argument("--only-2-layer", action="store_true", help="the 2-layer rows only (no full-size conversion)")
    a = p.parse_args()
    for weights in a.weights.split(","):
        for ctx in (int(c) for c in a.ctx.split(",")):
            row = {"when": time.strftime("%Y-%m-%d %H:%M:%S"), "code_commit": code_commit(),
                   "machine_at_start": machine(), "weights": weights, "ctx": ctx}
            for name, overrides, full in (("two_layers", list(TWO_LAYERS), False), ("full_size", [], True)):
                if full and a.only_2_layer:
                    continue
                print(f"{weights} ctx {ctx}, {name}: builds ...", flush=True)
                builds, cost = build_pair(overrides, ctx, weights, a.builds, full)
                print(f"{weights} ctx {ctx}, {name}: timing on the Core AI runtime ...", flush=True)
                row[name] = {"builds": {v: str(b) for v, b in builds.items()}, "build": cost,
                             **time_pair(builds, weights)}
                ms = row[name]["ms_per_token"]
                r = row[name]["qfold_over_repeat_kv"]
                print(f"  repeat_kv {ms['repeat_kv']:.1f} ms/token, qfold {ms['qfold']:.1f} ms/token, qfold/repeat_kv "
                      + (f"×{r['median']:.2f} [{r['low']:.2f}, {r['high']:.2f}] ({r['level']:.0%})" if r else "n/a"),
                      flush=True)
            row["machine_at_end"] = machine()
            save(f"{weights}-ctx{ctx}", row)
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
