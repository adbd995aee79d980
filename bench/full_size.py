"""Full-size default preset (EXAONE 4.0 1.2B, ctx 4096, KV as state): build repeat_kv and qfold one after
the other (never two at once: ~15 GB each) and record conversion time and peak RSS of each child.

usage: PYTHONPATH=. python bench/full_size.py [--builds-dir DIR] [--compression SPEC] [--ship]
Writes bench/results/full_size[-SPEC].json; --ship copies the analyses to analyzer/shipped/.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from analyzer.build.builds import BuildSpec, run_build
from analyzer.graph.record import load_analysis
from analyzer.model.sources import DEFAULT_PRESET, resolve_source

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--builds-dir", default=None)
    p.add_argument("--compression", default=None)
    p.add_argument("--variants", default="repeat_kv,qfold")
    p.add_argument("--ship", action="store_true")
    a = p.parse_args()
    source = resolve_source(DEFAULT_PRESET)
    compression = None
    if a.compression:
        from analyzer.build.compress import canonical_spec

        compression = canonical_spec(a.compression, 30)
    rows = {}
    for variant in a.variants.split(","):
        spec = BuildSpec(source, variant, "state", 4096, compression)
        t0 = time.monotonic()
        result = run_build(spec, a.builds_dir, on_progress=lambda pr: print(
            f"[{pr.fraction * 100:3.0f}%] {pr.stage}: {pr.message}", file=sys.stderr, flush=True))
        doc = load_analysis(result.path)
        rows[variant] = {
            "key": result.key, "reused": result.reused, "wall_s": round(time.monotonic() - t0, 1),
            "timings": doc["timings"], "peak_rss_bytes": doc["peak_rss_bytes"],
            "package_bytes": doc["package_bytes"], "summary": {k: v for k, v in doc["summary"].items()
                                                               if k != "tiles"},
            "bytes_per_token": doc["bytes"]["bytes_per_token"], "equivalence": doc["equivalence"],
        }
        print(json.dumps({variant: rows[variant]["timings"], "peak_rss_GB": doc["peak_rss_bytes"] / 1e9}))
        if a.ship:
            dest = ROOT / "analyzer" / "shipped" / f"{DEFAULT_PRESET}-{variant}-state-ctx4096.analysis.json"
            dest.parent.mkdir(exist_ok=True)
            shutil.copyfile(result.path / "analysis.json", dest)
    out = ROOT / "bench" / "results" / f"full_size{'-' + a.compression if a.compression else ''}.json"
    out.write_text(json.dumps(rows, indent=1))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
