"""``inspect``: op counts, tiles and bytes per token of a build, an analysis.json or any .mlpackage."""

from __future__ import annotations

import json
import sys
from typing import Any

from analyzer import fmt


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="op counts, tiles and bytes per token of a build or any .mlpackage")
    p.add_argument("path", help="a build folder, an analysis.json, or any ML Program .mlpackage")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--ops", action="store_true", help="include the per-op byte table")
    p.add_argument("--csv", action="store_true", help="print the per-op byte table as CSV")
    p.set_defaults(func=cmd_inspect)


def inspect_document(path: str, with_ops: bool) -> tuple[dict[str, Any], list[dict]]:
    from analyzer.graph.accounting import account
    from analyzer.graph.record import load_program

    program, doc = load_program(path)
    s = doc["summary"]
    out = {
        "path": str(path),
        "total_ops": s["total_ops"],
        "const_ops": s["const_ops"],
        "non_const_ops": s["non_const_ops"],
        "op_counts": s["op_counts"],
        "tiles": s["tiles"],
        "tile_count": s["tile_count"],
        "tile_output_bytes": s["tile_output_bytes"],
        "bytes_per_token": doc["bytes"]["bytes_per_token"],
        "bytes_by_layer": doc["bytes"]["bytes_by_layer"],
        "unruled_op_types": doc["bytes"]["unruled_op_types"],
    }
    for key in ("key", "spec", "geometry", "equivalence", "timings", "peak_rss_bytes", "compression_report"):
        if key in doc:
            out[key] = doc[key]
    rows = account(program).op_rows() if with_ops else []
    if with_ops:
        out["ops"] = rows
    return out, rows


def cmd_inspect(args) -> int:
    from analyzer.graph.accounting import OP_COLUMNS

    doc, rows = inspect_document(args.path, args.ops or args.csv)
    if args.csv:
        sys.stdout.write(fmt.to_csv(rows, OP_COLUMNS))
        return 0
    if args.json:
        print(json.dumps(doc))
        return 0
    print(f"{doc['path']}: {doc['total_ops']:,} ops ({doc['const_ops']:,} const, {doc['non_const_ops']:,} other)")
    print(fmt.table([(t, n) for t, n in doc["op_counts"].items()], ("op type", "count")))
    print(f"\n{doc['tile_count']} tile ops, {fmt.bytes_both(doc['tile_output_bytes'])} of output")
    if doc["tiles"]:
        print(fmt.table([(t["layer"], t["name"], str(t["input_shape"]), str(t["output_shape"]), t["dtype"],
                          t["output_bytes"], t["kind"]) for t in doc["tiles"]],
                        ("layer", "name", "input", "output", "dtype", "bytes", "kind")))
    b = doc["bytes_per_token"]
    print("\nbytes per decode token")
    print(fmt.table([(k, b[k], fmt.mib(b[k])) for k in b], ("category", "bytes", "MiB")))
    if doc["unruled_op_types"]:
        print(f"\nop types with no byte rule (charged as generic compute): {', '.join(doc['unruled_op_types'])}")
    if args.ops:
        print()
        print(fmt.table([[r[c] for c in OP_COLUMNS] for r in rows], OP_COLUMNS))
    return 0
