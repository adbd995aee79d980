"""``qfold explore`` at scale (issue 38): the full-size default pair (the shipped EXAONE 4.0 1.2B repeat_kv / Q-fold
analyses, ~4,600 ops each) and a Llama-3.1-70B-class structure pair (80 layers, ~10,000 ops each) exported for
Model Explorer and opened side by side in headless Chromium.

    PYTHONPATH=. .venv/bin/python bench/explore_scale.py [--seventy A_BUILD B_BUILD]

Without ``--seventy`` the 70B pair is built first (``--structure``, analysis mode: ~1 GB, minutes) in a temporary
builds folder. Per pair, one run: the export (reading both analyses, the structural diff, the graphs and overlays,
writing the files) and the time from opening the URL until both panes are drawn (each pane's side panel lists the
root-level groups, which Model Explorer fills once the graph is laid out), the root-level groups (every layer
collapsed, plus ``outside``), the files' sizes. Results: bench/results/explore_scale.json, with the machine's
load average (the machine is shared: a loaded run is slower).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

from analyzer.analysis.record import load_analysis
from analyzer.convert.launch import run_builds
from analyzer.model.sources import STRUCTURE_OVERRIDES, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, BuildSpec
from analyzer.report import explorer as mx
from analyzer.report.catalog import SHIPPED_DIR

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "explore_scale.json"
CHROMIUM = "/usr/bin/chromium"
DRAW_TIMEOUT_MS = 600_000
FULL_SIZE = (SHIPPED_DIR / "exaone-4.0-1.2b-repeat_kv-state-ctx4096.analysis.json",
             SHIPPED_DIR / "exaone-4.0-1.2b-qfold-state-ctx4096.analysis.json")


def seventy_pair(root: Path) -> tuple[Path, Path]:
    source = resolve_source("llama-3.1-70b", STRUCTURE_OVERRIDES)
    specs = [BuildSpec(source, v, "state", 4096, build_mode=ANALYSIS_MODE) for v in ("repeat_kv", "qfold")]
    a, b = (r.path for r in run_builds(specs, root))
    return a, b


def root_groups(page, panel) -> list[str]:
    """Every row of the side panel's root-level table (50 a page: the pages are turned)."""
    names: list[str] = []
    for _ in range(20):
        rows = panel.locator("table").nth(1).locator("tr").all_inner_texts()[1:]
        new = [n for n in (r.split("\t")[1].strip() for r in rows) if n not in names]
        if not new:
            break
        names += new
        page.wait_for_timeout(200)
        # the page button's icon sits under the panel's header: its click is dispatched, not aimed
        panel.locator("paginator").first.get_by_text("chevron_right").dispatch_event("click")
        page.wait_for_timeout(500)
    return names


def measure(name: str, a_path: Path, b_path: Path) -> dict:
    t0 = time.perf_counter()
    a, b = load_analysis(a_path), load_analysis(b_path)
    t1 = time.perf_counter()
    bundle = mx.build_bundle(mx.ExploreSide("A", (a,)), mx.ExploreSide("B", (b,)))
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="qfold-explore-bench-") as tmp:
        folder = Path(tmp)
        bundle.write(folder)
        t3 = time.perf_counter()
        instance = mx.start_explorer(bundle, folder)
        try:
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1500, "height": 1000})
                page.route("**/*", lambda r: r.continue_() if "127.0.0.1" in r.request.url else r.abort())
                start = time.perf_counter()
                page.goto(instance.url)
                page.get_by_text("Root-level nodes stats").nth(1).wait_for(timeout=DRAW_TIMEOUT_MS)
                drawn = time.perf_counter() - start
                groups = root_groups(page, page.locator("node-data-provider-summary-panel").first)
                slug = "-".join(name.split()[:1])  # "full-size", "llama-3.1-70b"
                page.screenshot(path=str(RESULTS.with_name(f"explore_scale-{slug}.png")))
                browser.close()
        finally:
            instance.stop()
    layers = [g for g in groups if g.startswith("layers.")]
    return {"pair": name, "ops": [a.program.total_ops, b.program.total_ops],
            "read_s": round(t1 - t0, 2), "export_s": round(t2 - t1, 2), "write_s": round(t3 - t2, 2),
            "export_total_s": round(t3 - t0, 2), "drawn_s": round(drawn, 1),
            "root_groups": len(groups), "collapsed_layers": len(layers),
            "files": len(bundle.files), "bytes": sum(len(v) for v in bundle.files.values()),
            "graph_json_bytes": [len(bundle.files["a.graph.json"]), len(bundle.files["b.graph.json"])],
            "mapped_ops": bundle.mapped, "loadavg_end": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seventy", nargs=2, metavar=("A", "B"), help="the 70B-class structure pair's build folders")
    ap.add_argument("--skip-full-size", action="store_true", help="measure the 70B-class pair only")
    args = ap.parse_args()
    rows = [] if args.skip_full_size else [measure("full-size default", *FULL_SIZE)]
    if rows:
        print(json.dumps(rows[-1]), flush=True)
    if args.seventy:
        a70, b70 = map(Path, args.seventy)
        rows.append(measure("llama-3.1-70b structure", a70, b70))
    else:
        with tempfile.TemporaryDirectory(prefix="qfold-explore-70b-") as tmp:
            rows.append(measure("llama-3.1-70b structure", *seventy_pair(Path(tmp))))
    print(json.dumps(rows[-1]), flush=True)
    if RESULTS.is_file():  # keep earlier runs of the other pair
        rows += [r for r in json.loads(RESULTS.read_text())["runs"] if r["pair"] not in {x["pair"] for x in rows}]
    RESULTS.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "machine": {
        "cpus": os.cpu_count(), "python": platform.python_version()}, "runs": rows}, indent=1) + "\n")
    print(RESULTS)


if __name__ == "__main__":
    main()
