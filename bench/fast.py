"""Analyse any size, fast (issues 10 and 23): what an analysis-mode A/B costs against one plain conversion, and
the 7-8B and 70B presets analysed in full on this machine. Run full-size parts under the machine-wide lock:

    flock /tmp/qfold-heavy.lock env PYTHONPATH=. .venv/bin/python bench/fast.py ratio --also llama-3.1-70b
    flock /tmp/qfold-heavy.lock env PYTHONPATH=. .venv/bin/python bench/fast.py presets --preset llama-3.1-8b
    flock /tmp/qfold-heavy.lock env PYTHONPATH=. .venv/bin/python bench/fast.py materialised
    PYTHONPATH=. .venv/bin/python bench/fast.py table [--write]   (the README's measured table, from fast.json)
    PYTHONPATH=. .venv/bin/python bench/fast.py plain-child OUT_DIR       (internal: the plain conversion)

``ratio`` (one run): plain ``ct.convert`` + save of the full-size default Q-fold step (a random fp32 model cast
to fp16 by coremltools, as probe/convert.py; ``analyzer.convert.step.convert_step``) in a child process, then
qfold's analysis-mode A/B of the same spec (both variants, one child, fresh builds folder: no cache, the
equivalence check included); wall time and peak RSS of each, as ratios; and the A/B analyses against the
shipped full-size analyses, category by category and op count by op count. ``--also PRESET`` adds, in the same
run, the A/B of each named preset at ctx 4096 with the ``presets`` checks and issue 23's targets for a 70B-class
model (≤ 10 min wall, ≤ 4 GB process-tree peak RSS).

``materialised``: qfold's materialised build (fp16 torch weights, a runnable package) of the default's Q-fold
step: what exporting a package from an analysis costs (analyzer/model/cost.py is fitted to it).

``presets``: the A/B of a preset in analysis mode at each ``--ctx``: wall and peak RSS, per-variant step times,
weights bytes per token against the analytic figure (2 bytes per parameter, an untied embedding charged for
the one row a token gathers), tiles against 2 per layer of Hq·ctx·D·2 bytes.

``table``: the README's measured table rendered from fast.json, each row with the date and load average of its
run; ``--write`` replaces the table between the README's ``bench/fast.py table`` markers.

Peak RSS is sampled every 0.1 s over the whole process tree of the measured work (a build child, its variant
worker and its equivalence worker run at once, so their RSS is summed), and the largest single process's RSS
beside it. Results are merged into bench/results/fast.json with the machine's CPU count, memory and load average
(per row, at its end); an entry measured again keeps its earlier values under ``history``.
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
    """Store ``value`` under ``section/key`` with the machine at this moment; an earlier value moves to
    ``history[section/key]`` (oldest first), so a re-run never erases what was measured before."""
    data = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    old = data.setdefault(section, {}).get(key)
    if old is not None:
        if "machine" not in old and "machine" in data:  # rows from before per-row machines: the file's last one
            old = {**old, "machine_of_file_when_replaced": data["machine"]}
        data.setdefault("history", {}).setdefault(f"{section}/{key}", []).append(old)
    value = {**value, "machine": machine()}
    data[section][key] = value
    data["machine"] = value["machine"]
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

    from analyzer.convert.step import convert_step
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
    from analyzer.convert.launch import run_builds
    from analyzer.model.sources import resolve_source
    from analyzer.model.spec import ANALYSIS_MODE, BuildSpec

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
           "converted_in_worker": {d["spec"]["variant"]: bool(d.get("converted_in_worker")) for d in docs},
           "equivalence_checked_on": next(c["weights"] for c in docs[0]["equivalence"]["checks"]
                                          if c["kind"] == "torch_variants")}
    return row, docs


def run_materialised(preset: str, ctx: int) -> dict:
    """qfold's materialised build (fp16 torch model, a runnable package) of the Q-fold variant: what exporting
    a package from an analysis costs."""
    from analyzer.convert.launch import run_builds
    from analyzer.model.sources import resolve_source
    from analyzer.model.spec import MATERIALISED_MODE, BuildSpec

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
    commit = code_commit()  # the code the builds import: the work tree now
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    print("plain ct.convert + save of the full-size default Q-fold step ...", flush=True)
    plain = run_plain()
    print(json.dumps(plain), flush=True)
    print("qfold analysis-mode A/B of the same spec ...", flush=True)
    ab, docs = run_ab("exaone-4.0-1.2b", 4096)
    shipped = compare_with_shipped(docs)
    ratios = {"ab_wall_over_plain_wall": round(ab["wall_s"] / plain["wall_s"], 3),
              "ab_peak_rss_over_plain_peak_rss": round(ab["peak_rss_tree_bytes"] / plain["peak_rss_tree_bytes"], 3)}
    same = all(all(c["bytes_per_token_equal"].values()) and c["op_counts_equal"] and c["bytes_by_layer_equal"]
               for c in shipped.values())
    row = {"plain": plain, "ab_analysis": ab, "ratios": ratios, "versus_shipped": shipped,
           "equal_to_shipped": same, "target_ab_wall_over_plain_wall": 0.3, "code_commit": commit,
           "when": time.strftime("%Y-%m-%d %H:%M:%S"), "machine_at_start": machine()}
    also = {}
    for preset in args.also:
        print(f"{preset} analysis-mode A/B at ctx 4096, same run ...", flush=True)
        also[preset] = preset_row(preset, 4096)
        also[preset]["targets"] = {"wall_s_at_most": 600, "peak_rss_tree_bytes_at_most": 4 * 10**9,
                                   "met": also[preset]["wall_s"] <= 600
                                   and also[preset]["peak_rss_tree_bytes"] <= 4 * 10**9}
    if also:
        row["also_in_this_run"] = also
    save("ratio", "exaone-4.0-1.2b-ctx4096", row)
    for preset, r in also.items():
        save("presets", f"{preset}-ctx4096", {**r, "same_run_as": "ratio/exaone-4.0-1.2b-ctx4096"})
    print(f"\nplain conversion: {plain['wall_s']:.0f} s, {plain['peak_rss_tree_bytes'] / GB:.2f} GB peak RSS")
    print(f"analysis A/B:     {ab['wall_s']:.0f} s, {ab['peak_rss_tree_bytes'] / GB:.2f} GB peak RSS (tree)")
    print(f"ratios: wall {ratios['ab_wall_over_plain_wall']:.2f}x (target <= 0.3), "
          f"peak RSS {ratios['ab_peak_rss_over_plain_peak_rss']:.2f}x")
    for v, c in shipped.items():
        print(f"vs shipped {v}: every byte category equal={all(c['bytes_per_token_equal'].values())}, "
              f"op counts equal={c['op_counts_equal']} {c['op_count_differences'] or ''}, "
              f"bytes by layer equal={c['bytes_by_layer_equal']}")
    for preset, r in also.items():
        print(f"{preset}: {r['wall_s']:.0f} s, {r['peak_rss_tree_bytes'] / GB:.2f} GB peak RSS (tree); "
              f"targets met: {r['targets']['met']}; checks {r['checks']}")
    print(f"load average at the end: {os.getloadavg()}", flush=True)


def preset_row(preset: str, ctx: int) -> dict:
    """A preset's A/B at ``ctx``, with its weights bytes against the parameter count and its tiles checked."""
    from analyzer.model.sources import geometry_of, load_config, resolve_source

    g = geometry_of(load_config(resolve_source(preset)))
    expected_weights = analytic_weight_bytes(preset)
    row, _ = run_ab(preset, ctx)
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
    row["code_commit"] = code_commit()
    row["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return row


def cmd_presets(args) -> None:
    for ctx in (int(c) for c in args.ctx.split(",")):
        print(f"{args.preset} analysis A/B at ctx {ctx} ...", flush=True)
        row = preset_row(args.preset, ctx)
        save("presets", f"{args.preset}-ctx{ctx}", row)
        per = {v: f"{r['own_steps_s']:.0f} s" for v, r in row["variants"].items()}
        print(f"  wall {row['wall_s']:.0f} s (per variant {per}), peak RSS {row['peak_rss_tree_bytes'] / GB:.2f} GB "
              f"(largest process {row['max_process_rss_bytes'] / GB:.2f} GB); checks {row['checks']}", flush=True)


def code_commit() -> str:
    """The commit measured, ``+changes`` when analyzer/ differs from it."""
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    return git("rev-parse", "--short", "HEAD") + (" +changes" if git("status", "--porcelain", "--", "analyzer") else "")


def cmd_materialised(args) -> None:
    row = run_materialised(args.preset, 4096)
    row["when"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save("materialised", f"{args.preset}-qfold-ctx4096", row)
    print(f"materialised fp16 build: {row['wall_s']:.0f} s, {row['peak_rss_tree_bytes'] / GB:.2f} GB peak RSS, "
          f"package {row['package_bytes'] / GB:.2f} GB", flush=True)


# ------------------------------------------------------------------------------------------------- the README table
README = ROOT / "README.md"
TABLE_START = "<!-- bench/fast.py table: generated from bench/results/fast.json -->"
TABLE_END = "<!-- end of bench/fast.py table -->"
CTX_SWEEP_PRESETS = ("mistral-7b-v0.3", "llama-3.1-8b", "qwen2.5-7b")


def _measured(row: dict) -> str:
    load = row.get("machine", {}).get("load_average_1_5_15")
    code = f", code {row['code_commit']}" if "code_commit" in row else ", before issue 23's changes"
    return f"{row.get('when', '?')[:10]}{f', load {load[0]:.1f}' if load else ''}{code}"


def _steps(row: dict) -> str:
    return " / ".join(f"{row['variants'][v]['own_steps_s']:.0f} s" for v in ("repeat_kv", "qfold"))


def table(data: dict) -> str:
    """The README's measured table from fast.json (every figure a field of it)."""
    ratio = data["ratio"]["exaone-4.0-1.2b-ctx4096"]
    plain, ab, r = ratio["plain"], ratio["ab_analysis"], ratio["ratios"]
    when = _measured(ratio)
    same = ratio.get("equal_to_shipped", all(all(c["bytes_per_token_equal"].values()) and c["op_counts_equal"]
                                             and c["bytes_by_layer_equal"] for c in ratio["versus_shipped"].values()))
    how = ("one child, the second variant in a worker beside it" if any(ab.get("converted_in_worker", {}).values())
           else "one child, one variant after the other")
    rows = [
        ("plain `ct.convert` + save of the full-size default Q-fold step (fp32 random weights, as `probe/convert.py`)",
         f"{plain['wall_s']:.0f} s", f"{plain['peak_rss_tree_bytes'] / GB:.2f} GB", when),
        (f"qfold A/B of the same spec, analysis mode, both variants ({how}), equivalence included; every byte "
         f"category and op count equal to the shipped analyses: {'yes' if same else 'NO'} (repeat_kv / Q-fold "
         f"steps {_steps(ab)})",
         f"{ab['wall_s']:.0f} s ({r['ab_wall_over_plain_wall']:.2f}×)",
         f"{ab['peak_rss_tree_bytes'] / GB:.2f} GB ({r['ab_peak_rss_over_plain_peak_rss']:.2f}×)", when)]
    for m in data.get("materialised", {}).values():
        rows.append((f"qfold materialised build (fp16 torch weights, runnable package {m['package_bytes'] / GB:.2f} "
                     f"GB), Q-fold, {m['preset']}", f"{m['wall_s']:.0f} s", f"{m['peak_rss_tree_bytes'] / GB:.2f} GB",
                     _measured(m)))
    presets = data.get("presets", {})
    for p in presets.values():
        if p["ctx"] != 4096:
            continue
        met = p.get("targets", {}).get("met")
        rows.append((f"{p['preset']} A/B, analysis mode (repeat_kv / Q-fold steps {_steps(p)})"
                     + ("" if met is None else f"; ≤ 10 min and ≤ 4 GB: {met}"),
                     f"{p['wall_s']:.0f} s", f"{p['peak_rss_tree_bytes'] / GB:.2f} GB", _measured(p)))
    wide = [presets[k] for k in (f"{n}-ctx32768" for n in CTX_SWEEP_PRESETS) if k in presets]
    if wide:
        kv = " / ".join(f"{w['checks']['kv_state_bytes'] / GB:.1f}" for w in wide)
        rows.append((f"{' / '.join(w['preset'] for w in wide)} at ctx 32768 (KV state {kv} GB, never made resident)",
                     " / ".join(f"{w['wall_s']:.0f}" for w in wide) + " s",
                     " / ".join(f"{w['peak_rss_tree_bytes'] / GB:.2f}" for w in wide) + " GB",
                     "; ".join(sorted({_measured(w) for w in wide}))))
    lines = ["| run (ctx 4096 unless said) | wall | peak RSS (process tree) | measured (1-min load average) |",
             "| --- | --- | --- | --- |"] + [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def cmd_table(args) -> None:
    text = table(json.loads(RESULTS.read_text()))
    print(text)
    if args.write:
        readme = README.read_text()
        start, end = readme.index(TABLE_START) + len(TABLE_START), readme.index(TABLE_END)
        README.write_text(readme[:start] + "\n" + text + "\n" + readme[end:])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pa = sub.add_parser("ratio")
    pa.add_argument("--also", action="append", default=[], metavar="PRESET",
                    help="the A/B of this preset at ctx 4096 in the same run (e.g. llama-3.1-70b)")
    pt = sub.add_parser("table")
    pt.add_argument("--write", action="store_true", help="replace the table in README.md")
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
    elif a.cmd == "table":
        cmd_table(a)
    elif a.cmd == "materialised":
        cmd_materialised(a)
    else:
        cmd_presets(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
