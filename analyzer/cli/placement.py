"""``placement PLAN ANALYSIS``: where a device put the ops of one analysis (a compute plan or profiler report,
recognised by content) — ops and bytes per token per device, the ops off the Neural Engine and why, what did not
match, and the cost (or cost-model time) share per byte category."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from analyzer import fmt
from analyzer.analysis.record import Analysis, load_analysis
from analyzer.errors import QfoldError
from analyzer.measure.logs import LogIssue
from analyzer.measure.placement import PlacementJoin, PlacementPlan, join_plan, parse_plan
from analyzer.measure.placement.plan_records import DEFAULT_PLAN_LIMITS

OFF_ANE_SHOWN = 20


def add_parser(sub) -> None:
    p = sub.add_parser("placement", help="join a compute plan / profiler report to an analysis: ops per device")
    p.add_argument("plan", help="qfold compute-plan JSON (scripts/macos/profile_coreml.py), a qfold bench profile "
                                "(bench --profile-out), coreai-build inspect --ops --json, anemll-profile report, "
                                "CoreMLInspect or coreml_profiling output (recognised by content)")
    p.add_argument("analysis", help="build folder, analysis.json, .mlpackage or .aimodel")
    p.add_argument("--function", metavar="F", help="the function of the analysis (a multi-function package) to "
                                                   "join (default: its default function)")
    p.add_argument("--plan-function", metavar="P",
                   help="the plan's function (a bench profile: its target's label) to join (default: the one named "
                        "like the analysis's function, else like its build key, else the plan's only one)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_placement)


def read_plan_file(path: str) -> PlacementPlan:
    """A plan file, its bad records warned about on stderr; QfoldError when the file is refused whole."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > DEFAULT_PLAN_LIMITS.max_file_bytes:
            raise QfoldError(f"{path}: {size:,} bytes, over the {DEFAULT_PLAN_LIMITS.max_file_bytes:,}-byte limit")
        data = p.read_bytes()
    except OSError as e:
        raise QfoldError(f"{path}: cannot read ({e.strerror or e})") from e
    plan = parse_plan(data, p.name)
    if not plan.accepted:
        raise QfoldError("; ".join(_where(path, i) for i in plan.errors))
    for issue in plan.issues:
        print(issue.describe(), file=sys.stderr)
    return plan


def _where(path: str, issue: LogIssue) -> str:
    """``PATH[:line][, column 'c']: why`` for a refused file."""
    column = f", column {issue.column!r}" if issue.column else ""
    return f"{path}{'' if issue.line is None else f':{issue.line}'}{column}: {issue.message}"


def join_for_cli(plan_path: str, analysis: Analysis, function: str | None = None) -> PlacementJoin:
    return join_plan(read_plan_file(plan_path), analysis, function)


def print_join(j: PlacementJoin) -> None:
    print(f"plan {j.plan_file} ({j.plan_format}, {j.coverage.replace('_', ' ')}) → function {j.analysis_function}: "
          f"{j.n_matched:,} ops matched")
    rows = [(d.device, d.ops, fmt.size(d.bytes_per_token, "auto", None),
             "" if d.cost_weight is None else f"{100 * d.cost_weight:.1f}%") for d in j.by_device]
    print(fmt.table(rows, ("device", "ops", "bytes/token", "cost")))
    if j.unplaced_bytes_per_token:
        print(f"not placed: {fmt.size(j.unplaced_bytes_per_token, 'auto', None)} per token")
    off = j.off_ane
    if off:
        print(f"\noff the Neural Engine: {len(off):,} ops")
        print(fmt.table([(o.device, o.op_type, o.name, o.layer if o.layer is not None else "",
                          fmt.size(o.bytes.total, "auto", None), o.reason or "")
                         for o in off[:OFF_ANE_SHOWN]], ("device", "type", "op", "layer", "bytes/token", "reason")))
        if len(off) > OFF_ANE_SHOWN:
            print(f"… and {len(off) - OFF_ANE_SHOWN:,} more (--json lists all)")
    costed = sorted((o for o in j.matched if o.estimate_ms is not None or o.moved_bytes is not None),
                    key=lambda o: (-(o.estimate_ms or 0), o.index))
    if costed:
        print(f"\nops the report costs one by one: {len(costed):,} (ms, MB and GB/s as the report prints them)")
        print(fmt.table([(o.device, o.op_type, o.name, "" if o.estimate_ms is None else f"{o.estimate_ms:.6f}",
                          "" if o.moved_bytes is None else f"{o.moved_bytes / 1e6:.2f}",
                          "" if o.bytes_per_s is None else f"{o.bytes_per_s / 1e9:.2f}", o.bound or "",
                          ", ".join(o.tables)) for o in costed[:OFF_ANE_SHOWN]],
                        ("device", "type", "op", "ms", "MB", "GB/s", "bound", "tables")))
    if j.category_shares:
        basis = j.category_shares[0].basis
        print(f"\nshare of the {basis} by byte category")
        print(fmt.table([(s.category, f"{100 * s.share:.1f}%") for s in j.category_shares if s.amount],
                        ("category", "share")))
    ambiguous = sum(1 for u in j.unmatched_plan if u.ambiguous)
    print(f"\nunmatched: {len(j.unmatched_plan):,} plan op(s) ({ambiguous:,} ambiguous: a cut name several ops "
          f"share), {len(j.unmatched_analysis):,} compute op(s) of the analysis not in the plan")
    for u in j.unmatched_plan[:OFF_ANE_SHOWN]:
        print(f"  plan {u.label} ({u.op_type}{f', line {u.line}' if u.line else ''}): {u.why}")
    for name in j.unmatched_analysis[:OFF_ANE_SHOWN]:
        print(f"  analysis {name}: not in the plan")
    if j.segments is not None:
        by = ", ".join(f"{d} {n}" for d, n in j.segments.by_device)
        print(f"\nsegments: {j.segments.total} ({by}; {j.segments_why})")
    else:
        print(f"\nsegments: not given ({j.segments_why})")
    if j.op_counts:
        print(fmt.table([(n, p, a, "" if p == a else "differs") for n, p, a in j.op_counts],
                        ("operation", "plan count", "analysis count", "")))
    for note in j.notes:
        print(f"note: {note}")


def cmd_placement(args) -> int:
    analysis = load_analysis(args.analysis, args.function)
    j = join_for_cli(args.plan, analysis, args.plan_function)
    if args.json:
        print(json.dumps(j.to_json(), allow_nan=False))
    else:
        print_join(j)
    return 0
