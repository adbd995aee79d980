"""``diff``: A/B of two analyses: op-count deltas, tiles, bytes per token by category."""

from __future__ import annotations

import json

from analyzer import fmt


def add_parser(sub) -> None:
    p = sub.add_parser("diff", help="A/B: op-count deltas, tiles, bytes per token")
    p.add_argument("a", help="build folder, analysis.json or .mlpackage (baseline)")
    p.add_argument("b", help="build folder, analysis.json or .mlpackage (candidate)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diff)


def cmd_diff(args) -> int:
    from analyzer.graph.diff import diff_documents
    from analyzer.graph.record import load_program

    d = diff_documents(load_program(args.a)[1], load_program(args.b)[1])
    if args.json:
        print(json.dumps(d))
        return 0
    t = d["total_ops"]
    print(f"ops: {t['a']:,} → {t['b']:,} ({t['delta']:+,})")
    print(fmt.table([(r["type"], r["a"], r["b"], r["delta"]) for r in d["op_count_deltas"]],
                    ("op type", "A", "B", "delta")))
    tc = d["tile_count"]
    print(f"\ntiles: {tc['a']} → {tc['b']}; tile output removed: {fmt.bytes_both(d['tile_bytes_removed'])}")
    print("\nbytes per decode token")
    print(fmt.table([(k, v["a"], v["b"], v["delta"]) for k, v in d["bytes_per_token"].items()],
                    ("category", "A", "B", "delta")))
    return 0
