"""Full-size fold vs one plain conversion (issue #9 Done-when), measured in one run on this machine.

1. ``fold``: ``analyzer.fold.coreml.package.fold_package`` of the full-size default ``repeat_kv`` build (EXAONE 4.0
   1.2B, ctx 4096, KV as state): milproto load → the pass → ct.convert (pass-only pipeline) → save → per-constant
   weight check; then, timed apart, the interpreter proof over ``--proof-steps`` decode steps.
2. ``convert``: one plain conversion of the same model, probe-style: the qfold decode step traced and converted by
   ``analyzer.convert.child.convert_step`` (the default pass pipeline) and saved; no equivalence, no analysis.
Each runs in its own child process, so each peak RSS is its own. Then the folded package is diffed against the
qfold build of the same spec: bytes per token must be equal in every category (op counts may differ; listed).

usage (needs ~15 GB; never two at once):
  flock /tmp/qfold-fullsize.lock python bench/fold_full_size.py --builds-dir /work/fullsize-builds
Writes bench/results/fold_full_size.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def stage_fold(repeat_kv: str, out: str, proof_steps: int) -> dict:
    from analyzer import quiet_coremltools

    quiet_coremltools()
    from analyzer.fold.coreml.package import fold_package
    from analyzer.fold.proof import prove_fold

    t0 = time.monotonic()
    report = fold_package(repeat_kv, out)
    fold_s = time.monotonic() - t0
    rss_fold = _peak_rss_bytes()
    t1 = time.monotonic()
    proof = prove_fold(repeat_kv, out, steps=proof_steps) if proof_steps else None
    return {"fold_s": round(fold_s, 1), "peak_rss_fold_bytes": rss_fold, "report": report.to_json(),
            "proof_s": round(time.monotonic() - t1, 1),
            "proof": None if proof is None else {"headline": proof.headline(), "max_abs_diff": proof.max_abs_diff,
                                                 "max_abs_value": proof.max_abs_value, "steps": proof.steps},
            "peak_rss_bytes": _peak_rss_bytes()}


def stage_convert(out: str) -> dict:
    from analyzer import quiet_coremltools

    quiet_coremltools()
    import torch

    from analyzer.convert.child import check_numpy, convert_step
    from analyzer.model.decode import DecodeStep, build_model
    from analyzer.model.sources import DEFAULT_PRESET, resolve_source

    check_numpy()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t0 = time.monotonic()
    model = build_model(resolve_source(DEFAULT_PRESET))
    build_s = time.monotonic() - t0
    t1 = time.monotonic()
    mlmodel = convert_step(DecodeStep(model, 4096, "qfold", "state").eval())
    convert_s = time.monotonic() - t1
    t2 = time.monotonic()
    mlmodel.save(out)
    save_s = time.monotonic() - t2
    return {"build_model_s": round(build_s, 1), "convert_s": round(convert_s, 1), "save_s": round(save_s, 1),
            "convert_and_save_s": round(convert_s + save_s, 1), "peak_rss_bytes": _peak_rss_bytes()}


def _child(*args: str) -> dict:
    """Run a stage in a child process; record its wall time and the machine's load average around it (the
    machine is shared: a load well over the CPU count stretches both stages)."""
    t0, load0 = time.monotonic(), os.getloadavg()[0]
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"child {args[:2]} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["child_wall_s"] = round(time.monotonic() - t0, 1)
    result["load_average_1min"] = {"start": round(load0, 2), "end": round(os.getloadavg()[0], 2)}
    return result


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--builds-dir", default="/work/fullsize-builds")
    p.add_argument("--proof-steps", type=int, default=2, help="decode steps of the interpreter proof (0: skip)")
    p.add_argument("--stage", choices=["fold", "convert"], help=argparse.SUPPRESS)
    p.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.stage == "fold":
        print(json.dumps(stage_fold(a.args[0], a.args[1], a.proof_steps)))
        return 0
    if a.stage == "convert":
        print(json.dumps(stage_convert(a.args[0])))
        return 0

    import psutil

    from analyzer.analysis.record import load_analysis
    from analyzer.cli.diff import diff_json
    from analyzer.compare.diff import diff_analyses
    from analyzer.model.sources import DEFAULT_PRESET, resolve_source
    from analyzer.model.spec import BuildSpec

    source = resolve_source(DEFAULT_PRESET)
    builds = Path(a.builds_dir)
    keys = {v: BuildSpec(source, v, "state", 4096).key for v in ("repeat_kv", "qfold")}
    for v, key in keys.items():
        if not (builds / key / "analysis.json").is_file():
            raise SystemExit(f"no full-size {v} build at {builds / key}: build it first (see the module docstring)")
    work = Path(tempfile.mkdtemp(prefix="qfold-fold-bench-", dir=builds))
    try:
        folded = work / "folded.mlpackage"
        fold = _child("--stage", "fold", "--proof-steps", str(a.proof_steps), "--",
                      str(builds / keys["repeat_kv"] / "model.mlpackage"), str(folded))
        convert = _child("--stage", "convert", "--", str(work / "plain.mlpackage"))
        after = load_analysis(folded)
        qfold = load_analysis(builds / keys["qfold"])
        d = diff_json(diff_analyses(qfold, after))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    unequal = {k: v for k, v in d["bytes_per_token"].items() if v["delta"]}
    result = {
        "machine": {"cpu_count": os.cpu_count(), "ram_bytes": psutil.virtual_memory().total},
        "model": f"{DEFAULT_PRESET}, ctx 4096, KV as state, fp16, seeded random weights",
        "repeat_kv_build": keys["repeat_kv"],
        "qfold_build": keys["qfold"],
        "fold": fold,
        "plain_conversion": convert,
        "fold_faster_than_plain_conversion": fold["fold_s"] < convert["convert_and_save_s"],
        "folded_tiles": after.summary.tile_count,
        "diff_vs_qfold_build": {
            "bytes_per_token": d["bytes_per_token"],
            "bytes_equal_in_every_category": not unequal,
            "op_count_deltas": d["op_count_deltas"],
            "total_ops": d["total_ops"],
        },
    }
    out = ROOT / "bench" / "results" / "fold_full_size.json"
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({"fold_s": fold["fold_s"], "plain_convert_and_save_s": convert["convert_and_save_s"],
                      "folded_tiles": result["folded_tiles"], "bytes_equal": not unequal,
                      "proof": (fold["proof"] or {}).get("headline")}))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
