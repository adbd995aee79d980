"""``diff``: A/B of two analyses: op-count deltas, tiles, bytes and FLOPs per token by category."""

from __future__ import annotations

import json
import sys
from typing import Any

from analyzer import fmt
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
from analyzer.cli.placement import join_for_cli
from analyzer.compare.diff import ABDiff, Change, diff_analyses
from analyzer.compare.diff_reasons import explain
from analyzer.errors import QfoldError
from analyzer.measure.placement import PlacementAB, compare_placement


def add_parser(sub) -> None:
    p = sub.add_parser("diff", help="A/B: op-count deltas, tiles, bytes per token")
    p.add_argument("a", help="build folder, analysis.json, .mlpackage or .aimodel (baseline)")
    p.add_argument("b", help="build folder, analysis.json, .mlpackage or .aimodel (candidate; another backend's "
                             "build too: every difference is explained by op kind)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--plan", action="append", default=[], metavar="A=PLAN|B=PLAN",
                   help="a compute plan or profiler report of side A or B (both: a placement section, with a "
                        "warning per device off the Neural Engine on which B has more ops or bytes than A)")
    p.add_argument("--plan-function", action="append", default=[], metavar="A=P|B=P",
                   help="the function of side A's or B's plan to join (a bench profile: a target's label; default: "
                        "as `placement`)")
    add_analysis_options(p)
    add_strict_option(p)
    p.set_defaults(func=cmd_diff)


def side_values(values: list[str], flag: str, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        side, sep, value = v.partition("=")
        if not sep or side not in ("A", "B") or not value:
            raise QfoldError(f"{flag} {v!r}: write A={what} or B={what}")
        if side in out:
            raise QfoldError(f"{flag} {side}= is given twice")
        out[side] = value
    return out


def _plans(values: list[str]) -> dict[str, str]:
    out = side_values(values, "--plan", "PLAN")
    if out and set(out) != {"A", "B"}:
        raise QfoldError("--plan: give both A=PLAN and B=PLAN (the placement section compares the two)")
    return out


def placement_section(plans: dict[str, str], a: Analysis, b: Analysis,
                      functions: dict[str, str] | None = None) -> PlacementAB:
    functions = functions or {}
    return compare_placement(join_for_cli(plans["A"], a, functions.get("A")),
                             join_for_cli(plans["B"], b, functions.get("B")))


def print_placement(ab: PlacementAB) -> None:
    print("\nplacement (ops · bytes per token), A → B")
    print(fmt.table([(d.device, f"{d.ops_a:,} → {d.ops_b:,}", f"{fmt.size(d.bytes_a, 'auto', None)} → "
                      f"{fmt.size(d.bytes_b, 'auto', None)}") for d in ab.devices], ("device", "ops", "bytes/token")))
    for side, j in (("A", ab.a), ("B", ab.b)):
        if j.unmatched_plan or j.unmatched_analysis:
            print(f"{side}: {len(j.unmatched_plan):,} plan op(s) and {len(j.unmatched_analysis):,} compute op(s) "
                  f"unmatched (placement {j.plan_file} --json lists them)")
    for w in ab.warnings:
        print(f"warning: {w.message}")


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
        "unsized_copies": {"a": d.unsized_copies.a, "b": d.unsized_copies.b},  # beside tile_count
        "tile_bytes_removed": d.tile_bytes_removed,
        "sized": {"a": d.sized_a, "b": d.sized_b},
        "unsized_reason": {"a": d.unsized_reason_a, "b": d.unsized_reason_b},
        "bytes_per_token": {k: _change(c) for k, c in d.bytes_per_token.items()},
        "bytes_by_layer": [{"layer": r.layer, "a": r.a, "b": r.b, "delta": r.delta} for r in d.bytes_by_layer],
        "flops_per_token": {k: _change(c) for k, c in d.flops_per_token.items()},
        "flops_per_call": {k: _change(c) for k, c in d.flops_per_call.items()},
    }


def print_reasons(a, b) -> None:
    reasons = explain(a, b)
    if a.program.backend != b.program.backend:
        print(f"\nbackends: A {a.program.backend}, B {b.program.backend}")
    if reasons:
        print("\nwhy, by op kind (the parts of each category add up to its delta)")
        print(fmt.table([(r.aspect, r.kind, r.a, r.b, r.delta, r.why) for r in reasons],
                        ("aspect", "kind", "A", "B", "delta", "why")))


def print_diff(d: ABDiff) -> None:
    t = d.total_ops
    print(f"ops: {t.a:,} → {t.b:,} ({t.delta:+,})")
    print(fmt.table([(r.type, r.a, r.b, r.delta) for r in d.op_count_deltas], ("op type", "A", "B", "delta")))
    tc, uc = d.tile_count, d.unsized_copies
    removed = ("could not be sized" if uc.a or uc.b else fmt.bytes_both(d.tile_bytes_removed))
    print(f"\ntiles: {tc.a}{_unsized(uc.a)} → {tc.b}{_unsized(uc.b)}; tile output removed: {removed}")
    unsized = [side for side, ok in (("A", d.sized_a), ("B", d.sized_b)) if not ok]
    if unsized:
        print(f"NOT SIZED: {' and '.join(unsized)} could not be sized; the figures below leave out what could not "
              "be (the warnings on stderr say why)")
    print("\nbytes per call (a decode call is one token)")
    print(fmt.table([(k, c.a, c.b, c.delta) for k, c in d.bytes_per_token.items()], ("category", "A", "B", "delta")))
    print("\nFLOPs per token (per prompt token for a prefill call)")
    print(fmt.table([(k, c.a, c.b, c.delta) for k, c in d.flops_per_token.items()], ("category", "A", "B", "delta")))


def _unsized(n: int) -> str:
    return f" ({n} unsized)" if n else ""


def cmd_diff(args) -> int:
    plans = _plans(args.plan)
    plan_functions = side_values(args.plan_function, "--plan-function", "P")
    if plan_functions and not plans:
        raise QfoldError("--plan-function: give --plan A=PLAN --plan B=PLAN too")
    side_a, side_b = load_for_cli(args.a, args), load_for_cli(args.b, args)
    check_shape_names(args, *(x.program for x in (*side_a, *side_b)))
    for label, side in (("A", side_a), ("B", side_b)):
        for assumed in side[0].program.assumed_shapes:
            print(f"{label}: flexible input analysed at {assumed.text}", file=sys.stderr)
    unsized = warn_unsized((f"{label} {where_of(path, x.function, len(side) > 1)}", x.sizing)
                           for label, path, side in (("A", args.a, side_a), ("B", args.b, side_b)) for x in side)
    _report(args, side_a, side_b, plans, plan_functions)
    check_strict(args, unsized)
    return 0


def _report(args, side_a, side_b, plans, plan_functions) -> None:
    top = diff_analyses(side_a[0], side_b[0])
    placement = placement_section(plans, side_a[0], side_b[0], plan_functions) if plans else None
    several = len(side_a) > 1 or len(side_b) > 1
    names_a, names_b = [a.function for a in side_a], [b.function for b in side_b]
    common = [n for n in names_a if n in names_b]
    by_b = {b.function: b for b in side_b}
    pairs = [(a, by_b[a.function]) for a in side_a if a.function in by_b]
    if args.json:
        out = {**diff_json(top), "weight_charge": args.weight_charge,
               "backends": {"a": side_a[0].program.backend, "b": side_b[0].program.backend},
               "reasons": [r.to_json() for r in explain(side_a[0], side_b[0])],
               "assumed_shapes": {"a": [x.to_json() for x in side_a[0].program.assumed_shapes],
                                  "b": [x.to_json() for x in side_b[0].program.assumed_shapes]}}
        if placement is not None:
            out["placement"] = placement.to_json()
        if several:
            out["functions"] = [{"function": a.function, **diff_json(diff_analyses(a, b))} for a, b in pairs]
            out["functions_only_in"] = {"a": [n for n in names_a if n not in common],
                                        "b": [n for n in names_b if n not in common]}
        print(json.dumps(out, allow_nan=False))
        return
    if not several:
        print_diff(top)
        print_reasons(side_a[0], side_b[0])
        if placement is not None:
            print_placement(placement)
        return
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
    if placement is not None:
        print(f"\n== placement of the default functions ({side_a[0].function} vs {side_b[0].function})")
        print_placement(placement)
