"""``diff``: A/B of two analyses: op-count deltas, tiles, bytes and FLOPs per token by category."""

from __future__ import annotations

import json
from typing import Any

from analyzer import fmt
from analyzer.cli.common import add_analysis_options, load_for_cli
from analyzer.graph.diff import ABDiff, Change, diff_analyses


def add_parser(sub) -> None:
    p = sub.add_parser("diff", help="A/B: op-count deltas, tiles, bytes per token")
    p.add_argument("a", help="build folder, analysis.json or .mlpackage (baseline)")
    p.add_argument("b", help="build folder, analysis.json or .mlpackage (candidate)")
    p.add_argument("--json", action="store_true")
    add_analysis_options(p)
    p.set_defaults(func=cmd_diff)


def _change(c: Change) -> dict[str, int]:
    return {"a": c.a, "b": c.b, "delta": c.delta}


def diff_json(d: ABDiff) -> dict[str, Any]:
    """The ``diff --json`` object (the CLI contract)."""
    return {
        "total_ops": _change(d.total_ops),
        "non_const_ops": _change(d.non_const_ops),
        "op_count_deltas": [{"type": r.type, "a": r.a, "b": r.b, "delta": r.delta} for r in d.op_count_deltas],
        "op_counts": [{"type": r.type, "a": r.a, "b": r.b, "delta": r.delta} for r in d.op_counts],
        "tiles": {"a": [t.to_json() for t in d.tiles_a], "b": [t.to_json() for t in d.tiles_b]},
        "tile_count": _change(d.tile_count),
        "tile_bytes_removed": d.tile_bytes_removed,
        "bytes_per_token": {k: _change(c) for k, c in d.bytes_per_token.items()},
        "bytes_by_layer": [{"layer": r.layer, "a": r.a, "b": r.b, "delta": r.delta} for r in d.bytes_by_layer],
        "flops_per_token": {k: _change(c) for k, c in d.flops_per_token.items()},
        "flops_per_call": {k: _change(c) for k, c in d.flops_per_call.items()},
    }


def print_diff(d: ABDiff) -> None:
    t = d.total_ops
    print(f"ops: {t.a:,} → {t.b:,} ({t.delta:+,})")
    print(fmt.table([(r.type, r.a, r.b, r.delta) for r in d.op_count_deltas], ("op type", "A", "B", "delta")))
    tc = d.tile_count
    print(f"\ntiles: {tc.a} → {tc.b}; tile output removed: {fmt.bytes_both(d.tile_bytes_removed)}")
    print("\nbytes per call (a decode call is one token)")
    print(fmt.table([(k, c.a, c.b, c.delta) for k, c in d.bytes_per_token.items()], ("category", "A", "B", "delta")))
    print("\nFLOPs per token (per prompt token for a prefill call)")
    print(fmt.table([(k, c.a, c.b, c.delta) for k, c in d.flops_per_token.items()], ("category", "A", "B", "delta")))


def cmd_diff(args) -> int:
    side_a, side_b = load_for_cli(args.a, args), load_for_cli(args.b, args)
    top = diff_analyses(side_a[0], side_b[0])
    several = len(side_a) > 1 or len(side_b) > 1
    names_a, names_b = [a.function for a in side_a], [b.function for b in side_b]
    common = [n for n in names_a if n in names_b]
    by_b = {b.function: b for b in side_b}
    pairs = [(a, by_b[a.function]) for a in side_a if a.function in by_b]
    if args.json:
        out = {**diff_json(top), "weight_charge": args.weight_charge}
        if several:
            out["functions"] = [{"function": a.function, **diff_json(diff_analyses(a, b))} for a, b in pairs]
            out["functions_only_in"] = {"a": [n for n in names_a if n not in common],
                                        "b": [n for n in names_b if n not in common]}
        print(json.dumps(out, allow_nan=False))
        return 0
    if not several:
        print_diff(top)
        return 0
    print(f"A has {len(side_a)} function(s), B {len(side_b)}; functions of the same name are compared "
          "(--function NAME picks one)")
    for n in [n for n in names_a if n not in common] + [n for n in names_b if n not in common]:
        print(f"only in {'A' if n in names_a else 'B'}: {n}")
    for a, b in pairs:
        print(f"\n== function {a.function}")
        print_diff(diff_analyses(a, b))
    if not pairs:
        print(f"\nno function in common; the default functions ({side_a[0].function} vs {side_b[0].function}):")
        print_diff(top)
    return 0
