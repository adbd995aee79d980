"""``reanalyze``: walk a build's saved package again and rewrite its analysis.json."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("reanalyze", help="walk a build's saved .mlpackage again and rewrite its analysis.json")
    p.add_argument("paths", nargs="+", help="build folders")
    p.set_defaults(func=cmd_reanalyze)


def cmd_reanalyze(args) -> int:
    from analyzer.build.builds import reanalyze_build

    for path in args.paths:
        doc = reanalyze_build(path)
        print(f"{path}: {doc['summary']['total_ops']:,} ops, {doc['bytes']['bytes_per_token']['total']:,} B/token")
    return 0
