"""Context sweeps at the price of two conversions (issue 23, item 3), timed on the 8B preset. Full-size work: run it
under the machine-wide lock:

    flock /tmp/qfold-heavy.lock env PYTHONPATH=. .venv/bin/python bench/sweep_derived.py

1. ``qfold sweep --model llama-3.1-8b --ctx 512,…,65536 --variant repeat_kv,qfold`` (analysis mode, local Ray with
   ``--num-cpus``) in a fresh builds folder, as the CLI runs it (a child process): wall time, process-tree peak RSS
   (the sweep, its Ray processes and build children, summed), conversions per variant (rows ``built``), the
   derived rows and the ctx they were derived from.
2. ``build --variant repeat_kv qfold --ctx N`` (one child per N, analysis mode) at ``--direct`` derived points, the
   largest ctx among them, in another fresh folder: wall time and peak RSS, and each derived row's analysis held
   against the direct build: the op table op for op (``analyzer.analysis.ctx_affine.same_program``), every byte
   category, every layer, every op count, FLOPs per token.

Results: ``bench/results/sweep_derived.json``, with the machine's CPU count, memory and load average, the sweep's wall
time over the direct A/B at ctx 4096 of the same run (issue 40's target: ≤ 3×) and its rows' figures against the
previous results file's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fast import TreeRss, machine  # bench/fast.py: the same tree-RSS sampler and machine record

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.analysis.ctx_affine import same_program  # noqa: E402
from analyzer.analysis.record import load_analysis  # noqa: E402
from analyzer.convert.launch import run_builds  # noqa: E402
from analyzer.model.sources import resolve_source  # noqa: E402
from analyzer.model.spec import ANALYSIS_MODE, BuildSpec  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "sweep_derived.json"
CTX = "512,1024,2048,4096,8192,16384,32768,65536"


def run_sweep_cli(model: str, ctx: str, builds: Path, table: Path, num_cpus: int) -> dict:
    cmd = [sys.executable, "-m", "analyzer", "sweep", "--model", model, "--ctx", ctx, "--variant", "repeat_kv,qfold",
           "--num-cpus", str(num_cpus), "--builds-dir", str(builds), "--out", str(table)]
    with TreeRss() as rss:
        t0 = time.monotonic()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        wall = time.monotonic() - t0
    (table.parent / "sweep.stderr").write_text(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"the sweep failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = json.loads(table.read_text())
    per_variant = {v: sorted(r["ctx"] for r in rows if r["variant"] == v and r["status"] == "built")
                   for v in ("repeat_kv", "qfold")}
    return {"command": " ".join(["qfold", *cmd[3:]]), "wall_s": round(wall, 1), "peak_rss_tree_bytes": rss.peak_bytes,
            "max_process_rss_bytes": rss.max_process_bytes,
            "conversions_per_variant": {v: len(c) for v, c in per_variant.items()},
            "converted_ctx": per_variant,
            "derived": sum(r["status"] == "derived" for r in rows),
            "summary_line": next((ln for ln in proc.stderr.splitlines() if ln.startswith("sweep: ")), ""),
            "rows": [{k: r[k] for k in ("variant", "ctx", "status", "derived_from_ctx", "seconds", "tile_count",
                                        "total_ops", "bytes_total", "bytes_kv_read", "bytes_replication",
                                        "flops_total")} for r in rows]}


def compare(derived_path: str, direct: Path) -> dict:
    d, b = load_analysis(derived_path), load_analysis(direct)
    checks = {"op_table": same_program(d.program, b.program) is None,
              "op_counts": d.summary.op_counts == b.summary.op_counts,
              "bytes_per_token": d.bytes_per_token == b.bytes_per_token,
              "bytes_by_layer": d.bytes_by_layer == b.bytes_by_layer,
              "flops_per_token": d.flops.per_token() == b.flops.per_token()}
    return {"equal": all(checks.values()), "checks": checks, "key": b.build.key, "total_ops": b.summary.total_ops,
            "bytes_total": b.bytes_per_token.total, "derived_from": d.build.extra.get("derived_from")}


def run_direct(model: str, ctx: int, rows: list[dict], folder: Path) -> dict:
    source = resolve_source(model)
    specs = [BuildSpec(source, v, "state", ctx, build_mode=ANALYSIS_MODE) for v in ("repeat_kv", "qfold")]
    with TreeRss() as rss:
        t0 = time.monotonic()
        results = run_builds(specs, folder)
        wall = time.monotonic() - t0
    out = {"ctx": ctx, "wall_s": round(wall, 1), "peak_rss_tree_bytes": rss.peak_bytes, "variants": {}}
    for spec, result in zip(specs, results, strict=True):
        row = next(r for r in rows if r["variant"] == spec.variant and r["ctx"] == ctx)
        if row["status"] != "derived":
            raise SystemExit(f"ctx {ctx} {spec.variant} was {row['status']}, not derived: choose a derived point")
        out["variants"][spec.variant] = compare(row["path"], result.path)
    return out


FIGURES = ("tile_count", "total_ops", "bytes_total", "bytes_kv_read", "bytes_replication", "flops_total")


def against_earlier(sweep: dict, direct: list[dict], results: Path) -> dict:
    """The sweep's wall time over the A/B at ctx 4096 built directly in the same run (issue 40: ≤ 3×), and its
    rows' figures against the previous results file's (the same 16 rows and figures, whatever was converted or
    derived)."""
    out: dict = {}
    ab = next((d for d in direct if d["ctx"] == 4096), None)
    if ab is not None:
        out["sweep_wall_over_ab_4096_wall"] = round(sweep["wall_s"] / ab["wall_s"], 3)
        out["target_sweep_over_ab_at_most"] = 3.0
    if results.is_file():
        before = {(r["variant"], r["ctx"]): r for r in json.loads(results.read_text())["sweep"]["rows"]}
        now = {(r["variant"], r["ctx"]): r for r in sweep["rows"]}
        differ = [f"{v} ctx {c}: {k}" for (v, c), r in now.items() for k in FIGURES
                  if (v, c) not in before or before[(v, c)][k] != r[k]]
        out["same_rows_and_figures_as_before"] = {"rows": len(now), "rows_before": len(before),
                                                  "equal": not differ and set(now) == set(before),
                                                  "differences": differ[:20]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--ctx", default=CTX)
    ap.add_argument("--direct", default="4096,65536", help="derived points to build directly (the largest among them)")
    ap.add_argument("--num-cpus", type=int, default=2)
    ap.add_argument("--out", type=Path, default=RESULTS, help="the results file (default bench/results/…)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="qfold-sweep-derived-"))
    try:
        sweep = run_sweep_cli(args.model, args.ctx, work / "builds", work / "sweep.json", args.num_cpus)
        print(json.dumps({k: v for k, v in sweep.items() if k != "rows"}, indent=1), flush=True)
        rows = json.loads((work / "sweep.json").read_text())
        direct = [run_direct(args.model, int(c), rows, work / "direct") for c in args.direct.split(",")]
        doc = {"model": args.model, "mode": ANALYSIS_MODE, "sweep": sweep, "direct_builds": direct,
               "all_equal": all(v["equal"] for d in direct for v in d["variants"].values()),
               "machine": machine(), "date": time.strftime("%Y-%m-%d"),
               **against_earlier(sweep, direct, args.out)}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(json.dumps({"direct": direct, "all_equal": doc["all_equal"],
                          **{k: doc[k] for k in ("sweep_wall_over_ab_4096_wall", "same_rows_and_figures_as_before")
                             if k in doc}}, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
