"""The full-size compressed Core AI A/B beside its Core ML twin (issue 41): weight bytes per token, the gap
category by category.

Builds EXAONE 4.0 1.2B (ctx 4096, KV as state, fp16 weights) with ``--backend coreai --compression PRESET``
(materialised: coreai-opt compresses the converted program; ~11 min and ~6 GB per variant before compression), both
variants in one child, then walks both assets and sets their byte account (``compressed`` weight charge) beside the
Core ML build of the same preset (the shipped analyses, ``analyzer/shipped/…-<preset>.analysis.json``, else a Core ML
analysis-mode build, which equals a materialised one op for op):

* bytes per token by category, Core ML vs Core AI, and the gap;
* the ``weights`` category by part (``analyzer.analysis.compression.weights_by_part``), with what each backend stores
  for the part (scheme, granularity, stored dtypes, from ``compression_report``), so the gap is explained where it
  is: a weight stored differently, or read differently (Core AI's runtime decompresses per call: an embedding table
  is decompressed whole, where Core ML's gather reads one row of indices and LUT);
* the ``activations`` category: the dense weights Core AI's per-call decompression writes and its readers read
  (``DecompressRule``), the rest of the activations beside Core ML's.

Run it alone on the machine:

    flock /tmp/qfold-fullsize.lock env PYTHONPATH=. nice -n 10 .venv/bin/python bench/coreai_compressed.py

Results in bench/results/coreai_compressed-<preset>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from analyzer.analysis.byte_account import CATEGORIES
from analyzer.analysis.compression import compression_report, weights_by_part
from analyzer.analysis.record import Analysis, read_analysis_file
from analyzer.convert.compress import canonical_spec
from analyzer.convert.launch import run_builds
from analyzer.ir.coreai.dialect import PER_CALL_DECOMPRESSION
from analyzer.model.sources import DEFAULT_PRESET, geometry_of, load_config, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, BuildSpec
from analyzer.report.catalog import SHIPPED_DIR, shipped_name

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
VARIANTS = ("repeat_kv", "qfold")


def coreml_twin(variant: str, spec: BuildSpec, preset: str, builds_dir: str | None,
                shipped_ok: bool) -> tuple[Analysis, str]:
    """The Core ML analysis of the same model, variant, ctx and compression: shipped, else built (analysis mode)."""
    shipped = SHIPPED_DIR / shipped_name(DEFAULT_PRESET, variant, spec.kv_mode, spec.ctx, compression=preset)
    if shipped_ok and shipped.is_file():
        return read_analysis_file(shipped), str(shipped.relative_to(ROOT))
    ml = BuildSpec(spec.source, variant, spec.kv_mode, spec.ctx, spec.compression, build_mode=ANALYSIS_MODE)
    (result,) = run_builds([ml], builds_dir)
    return read_analysis_file(result.path), result.key


def stored_by_part(a: Analysis) -> dict[str, dict]:
    """What the program stores per part: count, dense fp16 and stored bytes, and the distinct ways it stores them."""
    report = compression_report(a.program)
    out = {k: v.to_json() for k, v in report.by_part.items()}
    for part in out:
        ws = [w for w in report.weights if "+".join(w.parts) == part]
        out[part]["stored_as"] = sorted({" ".join(x for x in (w.scheme, w.granularity, f"({w.stored_dtypes})"
                                                              if w.stored_dtypes else "") if x) for w in ws})
    return out


def per_call_decompression(a: Analysis) -> dict[str, int]:
    """Bytes Core AI's per-call decompression ops move (their stored reads are weights; dense writes activations)."""
    acct = a.account
    rows = [r for r in acct.ops if r.type in PER_CALL_DECOMPRESSION]
    return {"ops": len(rows), "weights": sum(r.weights for r in rows),
            "dense_written_activations": sum(r.activations for r in rows)}


def side(a: Analysis) -> dict:
    acct = a.account
    totals = acct.totals()
    return {"bytes_per_token": {c: totals[c] for c in (*CATEGORIES, "total")},
            "weights_by_part": weights_by_part(a.program, acct),
            "stored_by_part": stored_by_part(a)}


def gap_text(ml: dict, ai: dict, decomp: dict) -> dict[str, str]:
    """One line per category and per weights part: Core AI minus Core ML, and why."""
    out = {}
    for c in CATEGORIES:
        d = ai["bytes_per_token"][c] - ml["bytes_per_token"][c]
        out[c] = f"{d:+,} B"
    out["activations"] += (f" (Core AI's per-call decompression writes {decomp['dense_written_activations']:,} B of "
                           "dense weights per call, and their readers read them again)")
    for part in sorted(set(ml["weights_by_part"]) | set(ai["weights_by_part"])):
        a, b = ml["weights_by_part"].get(part, 0), ai["weights_by_part"].get(part, 0)
        ml_as = "; ".join(v for k, w in ml["stored_by_part"].items() if part in k.split("+") for v in w["stored_as"])
        ai_as = "; ".join(v for k, w in ai["stored_by_part"].items() if part in k.split("+") for v in w["stored_as"])
        out[f"weights.{part}"] = f"{b - a:+,} B (Core ML {a:,}: {ml_as or '-'}; Core AI {b:,}: {ai_as or '-'})"
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compression", default="top8", help="a preset (default top8)")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--builds-dir")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config override (a trial run on a smaller model; the results file says so)")
    args = p.parse_args(argv)
    source = resolve_source(DEFAULT_PRESET, args.set)
    layers = geometry_of(load_config(source)).num_layers
    spec_text = canonical_spec(args.compression, layers)
    specs = [BuildSpec(source, v, "state", args.ctx, spec_text, backend="coreai") for v in VARIANTS]
    t0 = time.monotonic()
    results = run_builds(specs, args.builds_dir)
    wall = time.monotonic() - t0
    doc: dict = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
                 "model": source.label, "overrides": args.set, "compression": args.compression, "spec": spec_text,
                 "ctx": args.ctx, "wall_s": round(wall, 1),
                 "variants": {}}
    for spec, result in zip(specs, results, strict=True):
        ai = read_analysis_file(result.path)
        ml, ml_from = coreml_twin(spec.variant, spec, args.compression, args.builds_dir, not args.set)
        ai_side, ml_side = side(ai), side(ml)
        decomp = per_call_decompression(ai)
        doc["variants"][spec.variant] = {
            "coreai": {"key": result.key, "reused": result.reused, "timings_s": ai.build.timings_s,
                       "peak_rss_bytes": ai.build.peak_rss_bytes, "asset_bytes": ai.build.package_bytes,
                       "per_call_decompression": decomp, **ai_side},
            "coreml": {"from": ml_from, **ml_side},
            "weights_per_token": {"coreml": ml_side["bytes_per_token"]["weights"],
                                  "coreai": ai_side["bytes_per_token"]["weights"]},
            "gap": gap_text(ml_side, ai_side, decomp),
        }
        print(f"{spec.variant}: weights/token Core ML {ml_side['bytes_per_token']['weights']:,} B, Core AI "
              f"{ai_side['bytes_per_token']['weights']:,} B")
        for k, v in doc["variants"][spec.variant]["gap"].items():
            print(f"  {k:24s} {v}")
    out = RESULTS / f"coreai_compressed-{args.compression}{'-trial' if args.set else ''}.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
