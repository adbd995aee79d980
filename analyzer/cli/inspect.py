"""``inspect``: op counts, tiles, bytes and FLOPs per token of a build, an analysis.json or any .mlpackage."""

from __future__ import annotations

import json
import sys
from typing import Any

from analyzer import fmt
from analyzer.analysis.accounting import OP_COLUMNS
from analyzer.analysis.record import Analysis
from analyzer.cli.common import (
    add_analysis_options,
    add_strict_option,
    check_shape_names,
    check_strict,
    load_for_cli,
    warn_unsized,
    where_of,
)
from analyzer.model.spec import ANALYSIS_MODE

# Build fields inspect --json repeats, in this order (scripts read them).
_BUILD_FIELDS = ("key", "spec", "geometry", "equivalence", "timings", "peak_rss_bytes")


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="op counts, tiles and bytes per token of a build, any .mlpackage or .aimodel")
    p.add_argument("path", help="a build folder, an analysis.json, any ML Program .mlpackage or Core AI .aimodel")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--ops", action="store_true", help="include the per-op byte table")
    p.add_argument("--csv", action="store_true", help="print the per-op byte table as CSV")
    add_analysis_options(p)
    add_strict_option(p)
    p.set_defaults(func=cmd_inspect)


def inspect_json(analysis: Analysis, path: str, with_ops: bool = False) -> dict[str, Any]:
    """The ``inspect --json`` object: the CLI contract (total_ops, op_counts, tiles, bytes_per_token, ...)."""
    s, acc = analysis.summary, analysis.account
    out: dict[str, Any] = {
        "path": str(path),
        "total_ops": s.total_ops,
        "const_ops": s.const_ops,
        "non_const_ops": s.non_const_ops,
        "op_counts": dict(s.op_counts),
        "tiles": [t.to_json() for t in s.tiles],
        "tile_count": s.tile_count,
        "unsized_copies": s.unsized_copies,  # copies without a size or a verdict (analyzer.analysis.sizing)
        "tile_output_bytes": s.tile_output_bytes,
        "sized": analysis.sizing.sized,
        "unsized_reason": analysis.sizing.unsized_reason,
        "bytes_per_token": acc.per_token().to_json(),
        "bytes_by_layer": acc.by_layer(),
        "unruled_op_types": list(acc.unruled_op_types),
        "weight_charge": acc.weight_charge,
        "function": analysis.function,
        "backend": analysis.program.backend,
        "phase": analysis.call.phase,
        "tokens_per_call": analysis.call.tokens_per_call,
        "tokens_per_call_from": analysis.call.how,
        "assumed_shapes": [a.to_json() for a in analysis.program.assumed_shapes],
        **analysis.flops.to_json(),  # flops_per_token (per prompt token for a prefill), flops_per_call, by layer
    }
    if acc.unsized:
        out["unsized_tensors"] = [u.to_json() for u in acc.unsized]
    if not analysis.sizing.sized:
        out["unsized_reasons"] = list(analysis.sizing.reasons)
        out["unsized_copy_ops"] = [c.to_json() for c in analysis.sizing.unsized_copies]
    if analysis.build is not None:
        build = analysis.build.to_json()
        out.update({k: build[k] for k in _BUILD_FIELDS})
        out["build_mode"] = analysis.build.build_mode  # analysis (value-free weights, no package) | materialised
    if analysis.build is not None or analysis.compression.compressed_count:  # a foreign program's, when compressed
        out["compression_report"] = analysis.compression.to_json()
    if with_ops:
        flops = {r["index"]: r["total"] for r in analysis.flops.op_rows()}
        out["ops"] = [{**r, "flops": flops[r["index"]]} for r in acc.op_rows()]
    return out


def inspect_document(path: str, analyses: tuple[Analysis, ...], with_ops: bool) -> dict[str, Any]:
    """One function: its object. Several: the default function's object plus ``functions``, one object
    per function."""
    doc = inspect_json(analyses[0], path, with_ops)
    if len(analyses) > 1:
        doc["functions"] = [{"function": a.function, **inspect_json(a, path, with_ops)} for a in analyses]
    return doc


def print_analysis(a: Analysis, path: str, with_ops: bool) -> None:
    s, acc = a.summary, a.account
    backend = a.program.backend
    on = "" if backend == "coreml" else f"; backend {backend}"  # a Core ML package's line is as it always was
    print(f"{path}: {s.total_ops:,} ops ({s.const_ops:,} const, {s.non_const_ops:,} other){on}")
    for assumed in a.program.assumed_shapes:
        print(f"flexible input analysed at {assumed.text}")
    print(f"phase: {a.call.phase}, {a.call.tokens_per_call} token(s) per call ({a.call.how})")
    if a.build is not None:
        made = ("value-free weights, no package" if a.build.build_mode == ANALYSIS_MODE
                else f"weights with values, a runnable {'.aimodel' if backend == 'coreai' else 'package'}")
        print(f"build mode: {a.build.build_mode} ({made})")
    print(fmt.table([(t, n) for t, n in s.op_counts.items()], ("op type", "count")))
    what = "tile ops" if backend == "coreml" else "copy ops (coreai.tile, broadcast_in_dims, broadcast_to)"
    unsized = f" ({s.unsized_copies} unsized: no size or no verdict)" if s.unsized_copies else ""
    sized_copies = s.tile_count - s.unsized_copies
    output = (f"{fmt.bytes_both(s.tile_output_bytes)} of output" if not s.unsized_copies else
              "output could not be sized" + (f" ({fmt.bytes_both(s.tile_output_bytes)} from the {sized_copies} "
                                             "sized)" if sized_copies else ""))
    print(f"\n{s.tile_count} {what}{unsized}, {output}")
    incomplete = "" if a.sizing.sized else " — NOT SIZED: leaves out what could not be sized (see the warnings)"
    if s.tiles:
        print(fmt.table([(t.layer, t.name, str(t.to_json()["input_shape"]), str(list(t.output_shape)), t.dtype,
                          t.output_bytes, t.kind + (f" (in {t.composite}, per call)" if t.composite else ""))
                         for t in s.tiles],
                        ("layer", "name", "input", "output", "dtype", "bytes", "kind")))
    b = acc.per_token().to_json()
    call = a.call
    per = "decode token" if call.phase == "decode" else f"call ({call.tokens_per_call} prompt tokens)"
    print(f"\nbytes per {per} (weight charge: {acc.weight_charge}){incomplete}")
    print(fmt.table([(k, b[k], fmt.mib(b[k])) for k in b], ("category", "bytes", "MiB")))
    fc, ft = a.flops.per_call().to_json(), a.flops.per_token().to_json()
    print(f"\nFLOPs per call and {call.per_token_label} (a multiply-add = 2; conventions: analyzer/analysis/flops.py)"
          + incomplete)
    print(fmt.table([(k, fc[k], ft[k]) for k in fc], ("category", "per call", "per token")))
    if a.flops.unruled_op_types:
        print(f"op types with no FLOP rule (counted 0): {', '.join(a.flops.unruled_op_types)}")
    if a.compression.compressed_count:
        print(f"attention weights as stored: {a.compression.precision_text('attn') or 'not compressed'}")
    if acc.unruled_op_types:
        print(f"\nop types with no byte rule (charged as generic compute): {', '.join(acc.unruled_op_types)}")
    if acc.unsized:
        print(f"\n{len(acc.unsized)} tensors have a symbolic dimension (or no size) and are in no total, e.g. "
              + ", ".join(f"{u.tensor} {u.shape} ({u.op_name})" for u in acc.unsized[:5]))
    if with_ops:
        print()
        rows = acc.op_rows()
        print(fmt.table([[r[c] for c in OP_COLUMNS] for r in rows], OP_COLUMNS))


def cmd_inspect(args) -> int:
    analyses = load_for_cli(args.path, args)
    check_shape_names(args, *(a.program for a in analyses))
    several = len(analyses) > 1
    unsized = warn_unsized((where_of(args.path, a.function, several), a.sizing) for a in analyses)
    _report(args, analyses)
    check_strict(args, unsized)
    return 0


def _report(args, analyses: tuple[Analysis, ...]) -> None:
    if args.csv:  # several functions: one table with a leading function column
        several = len(analyses) > 1
        rows = [{"function": a.function, **r} if several else r for a in analyses for r in a.account.op_rows()]
        sys.stdout.write(fmt.to_csv(rows, ("function", *OP_COLUMNS) if several else OP_COLUMNS))
        return
    if args.json:
        print(json.dumps(inspect_document(args.path, analyses, args.ops), allow_nan=False))
        return
    if len(analyses) > 1:
        print(f"{args.path}: {len(analyses)} functions ({', '.join(a.function for a in analyses)}); "
              "each is reported on its own (--function NAME picks one)\n")
    for i, a in enumerate(analyses):
        if len(analyses) > 1:
            print(("\n" if i else "") + f"== function {a.function}")
        print_analysis(a, args.path, args.ops)
