"""Full-size builds (EXAONE 4.0 1.2B, ctx 4096, KV as state, by default): build each variant one after the other
(never two at once: ~15 GB each) and record conversion time and peak RSS of each child.

usage: PYTHONPATH=. python bench/full_size.py [--compression PRESET] [--variants repeat_kv,qfold] [--prefill Q_LEN]
                                             [--ship]
       PYTHONPATH=. python bench/full_size.py --every-shipped [--ship-dir DIR]      (what ``make shipped`` runs)
       common: [--builds-dir DIR] [--results-dir DIR]

Writes ``<results-dir>/full_size[-prefill<N>][-PRESET].json`` (default bench/results/). ``--ship`` writes each
analysis to ``<ship-dir>`` (default analyzer/shipped/) under the catalog's name for it
(``exaone-4.0-1.2b-<variant>-state-ctx4096[-prefill<N>][-<preset>].analysis.json``), so a compressed or prefill
pair never overwrites the fp16 decode one. ``--every-shipped`` rebuilds every file the shipped folder holds (named
by that convention) and ships it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil

from analyzer.analysis.record import read_analysis_file, write_analysis
from analyzer.convert.compress import PRESETS, canonical_spec
from analyzer.convert.launch import run_build
from analyzer.model.sources import DEFAULT_PRESET, geometry_of, load_config, resolve_source
from analyzer.model.spec import BuildSpec
from analyzer.report.catalog import (
    DEFAULT_CTX,
    DEFAULT_KV_MODE,
    SHIPPED_DIR,
    ShippedAnalysis,
    shipped_files,
    shipped_name,
)

ROOT = Path(__file__).resolve().parent.parent


def build_one(s: ShippedAnalysis, builds_dir: str | None) -> tuple[dict, object]:
    """Build what ``s`` names (reusing a cached build); its bench row and its analysis."""
    source = resolve_source(s.preset)
    compression = canonical_spec(s.compression, geometry_of(load_config(source)).num_layers) if s.compression else None
    t0 = time.monotonic()
    result = run_build(BuildSpec(source, s.variant, s.kv_mode, s.ctx, compression, phase=s.phase, q_len=s.q_len),
                       builds_dir,
                       on_progress=lambda pr: print(f"[{pr.fraction * 100:3.0f}%] {pr.stage}: {pr.message}",
                                                    file=sys.stderr, flush=True))
    analysis = read_analysis_file(result.path)
    info = analysis.build
    assert info is not None
    row = {
        "key": result.key, "reused": result.reused, "wall_s": round(time.monotonic() - t0, 1),
        "timings": info.timings_s, "peak_rss_bytes": info.peak_rss_bytes, "package_bytes": info.package_bytes,
        "summary": {k: v for k, v in analysis.summary.to_json().items() if k != "tiles"},
        "bytes_per_token": analysis.bytes_per_token.to_json(), "equivalence": analysis.to_json()["equivalence"],
    }
    print(json.dumps({s.variant: info.timings_s, "peak_rss_GB": info.peak_rss_bytes / 1e9}))
    return row, analysis


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--builds-dir", default=None)
    p.add_argument("--compression", default=None, choices=sorted(PRESETS), help="a compression preset")
    p.add_argument("--variants", default="repeat_kv,qfold")
    p.add_argument("--prefill", type=int, metavar="Q_LEN", default=None,
                   help="build prefill steps of Q_LEN prompt tokens per call instead of decode steps")
    p.add_argument("--ship", action="store_true", help="write the analyses into --ship-dir")
    p.add_argument("--every-shipped", action="store_true", help="rebuild and ship every file of analyzer/shipped/")
    p.add_argument("--ship-dir", type=Path, default=SHIPPED_DIR)
    p.add_argument("--results-dir", type=Path, default=ROOT / "bench" / "results")
    a = p.parse_args(argv)
    if a.every_shipped:
        wanted = shipped_files(SHIPPED_DIR)
        if not wanted:
            p.error(f"{SHIPPED_DIR} holds no analysis named by the convention")
    else:
        wanted = [ShippedAnalysis(DEFAULT_PRESET, v, DEFAULT_KV_MODE, DEFAULT_CTX, Path(), a.compression,
                                  "prefill" if a.prefill else "decode", a.prefill or 1)
                  for v in a.variants.split(",")]
    machine = {"cpu_count": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total}
    results: dict[str, dict] = defaultdict(lambda: {"machine": machine})
    for s in wanted:
        row, analysis = build_one(s, a.builds_dir)
        stem = "full_size" + (f"-prefill{s.q_len}" if s.phase == "prefill" else "") + \
            (f"-{s.compression}" if s.compression else "")
        if s.preset != DEFAULT_PRESET or (s.kv_mode, s.ctx) != (DEFAULT_KV_MODE, DEFAULT_CTX):
            stem += f"-{s.preset}-{s.kv_mode}-ctx{s.ctx}"
        results[stem][s.variant] = row
        if a.ship or a.every_shipped:
            a.ship_dir.mkdir(parents=True, exist_ok=True)
            dest = a.ship_dir / shipped_name(s.preset, s.variant, s.kv_mode, s.ctx, s.compression,
                                             s.q_len if s.phase == "prefill" else None)
            write_analysis(dest, analysis)
            print(dest)
    a.results_dir.mkdir(parents=True, exist_ok=True)
    for stem, rows in results.items():
        out = a.results_dir / f"{stem}.json"
        out.write_text(json.dumps(rows, indent=1))
        print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
