"""Analyse any size, fast (issue 10): what an analysis-mode A/B costs against one plain conversion, and the 7-8B
presets analysed in full on this machine. Run full-size parts under the machine-wide lock:

    flock /tmp/qfold-fullsize.lock env PYTHONPATH=. .venv/bin/python bench/fast.py ratio
    flock /tmp/qfold-fullsize.lock env PYTHONPATH=. .venv/bin/python bench/fast.py presets --preset llama-3.1-8b
    flock /tmp/qfold-fullsize.lock env PYTHONPATH=. .venv/bin/python bench/fast.py materialised
    PYTHONPATH=. .venv/bin/python bench/fast.py plain-child OUT_DIR       (internal: the plain conversion)

``ratio`` (one run): plain ``ct.convert`` + save of the full-size default Q-fold step (a random fp32 model cast
to fp16 by coremltools, as probe/convert.py; ``analyzer.build.step.convert_step``) in a child process, then
qfold's analysis-mode A/B of the same spec (both variants, one child, fresh builds folder: no cache, the
equivalence check included); wall time and peak RSS of each, as ratios; and the A/B analyses against the
shipped full-size analyses, category by category and op count by op count.

``materialised``: qfold's materialised build (fp16 torch weights, a runnable package) of the default's Q-fold
step: what exporting a package from an analysis costs (analyzer/model/cost.py is fitted to it).

``presets``: the A/B of a preset in analysis mode at each ``--ctx``: wall and peak RSS, per-variant step times,
weights bytes per token against the analytic figure (2 bytes per parameter, an untied embedding charged for
the one row a token gathers), tiles against 2 per layer of Hq·ctx·D·2 bytes.

Peak RSS is sampled every 0.1 s over the whole process tree of the measured work (a build child and its
equivalence worker run at once, so their RSS is summed), and the largest single process's RSS beside it.
Results are merged into bench/results/fast.json with the machine's CPU count and memory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "fast.json"
GB = 1e9


# ------------------------------------------------------------------------------------------------- measuring
class TreeRss:
    """Peak of the summed RSS of this process's descendants, and the largest single descendant's RSS, sampled
    every ``interval_s``."""

    def __init__(self, interval_s: float = 0.1):
        import psutil

        self._me = psutil.Process()
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.max_process_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            for p in self._me.children(recursive=True):
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                total += rss
                self.max_process_bytes = max(self.max_process_bytes, rss)
            self.peak_bytes = max(self.peak_bytes, total)
            time.sleep(self.interval_s)

    def __enter__(self) -> TreeRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def machine() -> dict:
    import psutil

    return {"cpu_count": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
            "platform": platform.platform(), "load_average_1_5_15": list(os.getloadavg())}


def save(section: str, key: str, value: dict) -> None:
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    data.setdefault(section, {})[key] = value
    data["machine"] = machine()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(data, indent=1) + "\n")


def _progress(t0: float):
    def show(p) -> None:
        print(f"  [{time.monotonic() - t0:7.1f} s {p.fraction * 100:3.0f}%] {p.stage}: {p.message}", flush=True)
    return show


# ------------------------------------------------------------------------------------------------- parts
def plain_child(out: Path) -> None:
    """The plain conversion, alone in this process: random fp32 model, Q-fold step, ct.convert, save."""
    from analyzer import quiet_coremltools

    quiet_coremltools()
    import torch

    from analyzer.build.step import convert_step
    from analyzer.model.decode import DecodeStep, build_model
    from analyzer.model.sources import DEFAULT_PRESET, resolve_source

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    t = {}
    t0 = time.monotonic()
    model = build_model(resolve_source(DEFAULT_PRESET))  # fp32: what the plain probe converted
    t["model_s"] = time.monotonic() - t0
    t1 = time.monotonic()
    mlmodel = convert_step(DecodeStep(model, 4096, "qfold", "state").eval())
    t["convert_s"] = time.monotonic() - t1
    del model
    t2 = time.monotonic()
    mlmodel.save(str(out / "plain.mlpackage"))
    t["save_s"] = time.monotonic() - t2
    print("@@plain " + json.dumps({k: round(v, 1) for k, v in t.items()}), flush=True)


def run_plain() -> dict:
    with tempfile.TemporaryDirectory(prefix="qfold-plain-") as tmp, TreeRss() as rss:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, __file__, "plain-child", tmp], cwd=ROOT, capture_output=True,
                              text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        wall = time.monotonic() - t0
    if proc.returncode != 0:
        raise SystemExit(f"plain conversion failed:\n{proc.stderr[-3000:]}")
    steps = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("@@plain "))[8:])
    return {"wall_s": round(wall, 1), "peak_rss_tree_bytes": rss.peak_bytes,
            "max_process_rss_bytes": rss.max_process_bytes, "steps_s": steps}


def _document(build: Path) -> dict:
    """A build's ``analysis.json`` as written (the bench records its raw fields)."""
    return json.loads((build / "analysis.json").read_text())


def run_ab(preset: str, ctx: int, keep: Path | None = None) -> tuple[dict, list[dict]]:
    """qfold's analysis-mode A/B (both variants, one child) in a fresh builds folder."""
    from analyzer.build.builds import ANALYSIS_MODE, BuildSpec, run_builds
    from analyzer.model.sources import resolve_source

    source = resolve_source(preset)
    specs = [BuildSpec(source, v, "state", ctx, build_mode=ANALYSIS_MODE) for v in ("repeat_kv", "qfold")]
    tmp = Path(tempfile.mkdtemp(prefix="qfold-ab-"))
    try:
        with TreeRss() as rss:
            t0 = time.monotonic()
            results = run_builds(specs, tmp, on_progress=_progress(t0))
            wall = time.monotonic() - t0
        docs = [_document(r.path) for r in results]
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            for r in results:
                shutil.copyfile(r.path / "analysis.json", keep / f"{r.key}.analysis.json")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    row = {"preset": preset, "ctx": ctx, "wall_s": round(wall, 1), "peak_rss_tree_bytes": rss.peak_bytes,
           "max_process_rss_bytes": rss.max_process_bytes,
           "variants": {d["spec"]["variant"]: {
               "key": d["key"], "timings_s": d["timings"],
               "own_steps_s": round(sum(v for k, v in d["timings"].items()
                                        if k in ("trace_s", "convert_s", "compress_s", "walk_s")), 1),
               "peak_rss_self_bytes_at_end": d["peak_rss_bytes"],
               "bytes_per_token": d["bytes"]["bytes_per_token"],
               "tile_count": d["summary"]["tile_count"], "tile_output_bytes": d["summary"]["tile_output_bytes"],
               "op_counts": d["summary"]["op_counts"], "total_ops": d["summary"]["total_ops"]} for d in docs},
           "equivalence_checked_on": next(c["weights"] for c in docs[0]["equivalence"]["checks"]
                                          if c["kind"] == "torch_variants")}
    return row, docs


def run_materialised(preset: str, ctx: int) -> dict:
    """qfold's materialised build (fp16 torch model, a runnable package) of the Q-fold variant: what exporting
    a package from an analysis costs."""
    from analyzer.build.builds import MATERIALISED_MODE, BuildSpec, run_builds
    from analyzer.model.sources import resolve_source

    spec = BuildSpec(resolve_source(preset), "qfold", "state", ctx, build_mode=MATERIALISED_MODE)
    tmp = Path(tempfile.mkdtemp(prefix="qfold-mat-"))
    try:
        with TreeRss() as rss:
            t0 = time.monotonic()
            (result,) = run_builds([spec], tmp, on_progress=_progress(t0))
            wall = time.monotonic() - t0
        doc = _document(result.path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"preset": preset, "ctx": ctx, "wall_s": round(wall, 1), "peak_rss_tree_bytes": rss.peak_bytes,
            "max_process_rss_bytes": rss.max_process_bytes, "timings_s": doc["timings"],
            "package_bytes": doc["package_bytes"],
            "weights_bytes_per_token": doc["bytes"]["bytes_per_token"]["weights"]}


def compare_with_shipped(docs: list[dict]) -> dict:
    from analyzer.model.sources import DEFAULT_PRESET

    out = {}
    for d in docs:
        v = d["spec"]["variant"]
        shipped = json.loads((ROOT / "analyzer" / "shipped" / f"{DEFAULT_PRESET}-{v}-state-ctx4096.analysis.json")
                             .read_text())
        a, b = d["bytes"]["bytes_per_token"], shipped["bytes"]["bytes_per_token"]
        ca, cb = d["summary"]["op_counts"], shipped["summary"]["op_counts"]
        out[v] = {
            "bytes_per_token_equal": {k: a[k] == b[k] for k in b},
            "op_counts_equal": ca == cb,
            "op_count_differences": {t: [ca.get(t, 0), cb.get(t, 0)] for t in set(ca) | set(cb)
                                     if ca.get(t, 0) != cb.get(t, 0)},
            "bytes_by_layer_equal": d["bytes"]["bytes_by_layer"] == shipped["bytes"]["bytes_by_layer"],
        }
    return out


def analytic_weight_bytes(preset: str) -> int:
    """fp16 parameter bytes a decode token reads, from the config alone (tests/test_fast_presets.py has the
    same rule): the projections, their biases, the norms, the gathered embedding row, the lm_head (all of it),
    the final norm and RoPE's D/2 inverse frequencies."""
    from analyzer.model.sources import load_config, resolve_source

    sys.path.insert(0, str(ROOT))
    from tests.test_fast_presets import weight_bytes_per_token

    return weight_bytes_per_token(load_config(resolve_source(preset)))


# ------------------------------------------------------------------------------------------------- commands
def cmd_ratio(args) -> None:
    print("plain ct.convert + save of the full-size default Q-fold step ...", flush=True)
    plain = run_plain()
    print(json.dumps(plain), flush=True)
    print("qfold analysis-mode A/B of the same spec ...", flush=True)
    ab, docs = run_ab("exaone-4.0-1.2b", 4096)
    shipped = compare_with_shipped(docs)
    ratios = {"ab_wall_over_plain_wall": round(ab["wall_s"] / plain["wall_s"], 3),
              "ab_peak_rss_over_plain_peak_rss": round(ab["peak_rss_tree_bytes"] / plain["peak_rss_tree_bytes"], 3)}
    row = {"plain": plain, "ab_analysis": ab, "ratios": ratios, "versus_shipped": shipped,
           "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    save("ratio", "exaone-4.0-1.2b-ctx4096", row)
    print(f"\nplain conversion: {plain['wall_s']:.0f} s, {plain['peak_rss_tree_bytes'] / GB:.2f} GB peak RSS")
    print(f"analysis A/B:     {ab['wall_s']:.0f} s, {ab['peak_rss_tree_bytes'] / GB:.2f} GB peak RSS (tree)")
    print(f"ratios: wall {ratios['ab_wall_over_plain_wall']:.2f}x (target <= 1.0), "
          f"peak RSS {ratios['ab_peak_rss_over_plain_peak_rss']:.2f}x (target <= 0.5)")
    for v, c in shipped.items():
        print(f"vs shipped {v}: every byte category equal={all(c['bytes_per_token_equal'].values())}, "
              f"op counts equal={c['op_counts_equal']} {c['op_count_differences'] or ''}, "
              f"bytes by layer equal={c['bytes_by_layer_equal']}")


def cmd_presets(args) -> None:
    from analyzer.model.sources import geometry_of, load_config, resolve_source

    g = geometry_of(load_config(resolve_source(args.preset)))
    expected_weights = analytic_weight_bytes(args.preset)
    for ctx in (int(c) for c in args.ctx.split(",")):
        print(f"{args.preset} analysis A/B at ctx {ctx} ...", flush=True)
        row, _ = run_ab(args.preset, ctx)
        tile = g.num_q_heads * ctx * g.head_dim * 2
        row["checks"] = {
            "analytic_weight_bytes": expected_weights,
            "weights_equal_analytic": {v: r["bytes_per_token"]["weights"] == expected_weights
                                       for v, r in row["variants"].items()},
            "expected_tile_output_bytes": {"repeat_kv": 2 * g.num_layers * tile, "qfold": 0},
            "tiles_as_expected": (row["variants"]["repeat_kv"]["tile_count"] == 2 * g.num_layers
                                  and row["variants"]["repeat_kv"]["tile_output_bytes"] == 2 * g.num_layers * tile
                                  and row["variants"]["qfold"]["tile_count"] == 0),
            "kv_state_bytes": 2 * g.num_layers * g.num_kv_heads * ctx * g.head_dim * 2,
        }
        row["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
        save("presets", f"{args.preset}-ctx{ctx}", row)
        per = {v: f"{r['own_steps_s']:.0f} s" for v, r in row["variants"].items()}
        print(f"  wall {row['wall_s']:.0f} s (per variant {per}), peak RSS {row['peak_rss_tree_bytes'] / GB:.2f} GB "
              f"(largest process {row['max_process_rss_bytes'] / GB:.2f} GB); checks {row['checks']}", flush=True)


def cmd_materialised(args) -> None:
    row = run_materialised(args.preset, 4096)
    row["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save("materialised", f"{args.preset}-qfold-ctx4096", row)
    print(f"materialised fp16 build: {row['wall_s']:.0f} s, {row['peak_rss_tree_bytes'] / GB:.2f} GB peak RSS, "
          f"package {row['package_bytes'] / GB:.2f} GB", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("ratio")
    pr = sub.add_parser("presets")
    pr.add_argument("--preset", required=True)
    pr.add_argument("--ctx", default="4096")
    pm = sub.add_parser("materialised")
    pm.add_argument("--preset", default="exaone-4.0-1.2b")
    pc = sub.add_parser("plain-child")
    pc.add_argument("out")
    a = p.parse_args()
    if a.cmd == "plain-child":
        plain_child(Path(a.out))
    elif a.cmd == "ratio":
        cmd_ratio(a)
    elif a.cmd == "materialised":
        cmd_materialised(a)
    else:
        cmd_presets(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
