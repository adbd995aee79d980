"""``reanalyze``: rewrite analyses with this version's walker (a build's saved package is walked again; an
analysis.json without a package has its stored ops' facts derived again)."""

from __future__ import annotations

from analyzer.convert.launch import reanalyze


def add_parser(sub) -> None:
    p = sub.add_parser("reanalyze", help="rewrite analyses with this version's walker and schema",
                       description=__doc__.split("\n\n")[0].removeprefix("``reanalyze``: "))
    p.add_argument("paths", nargs="+", help="build folders or analysis.json files")
    p.add_argument("--builds-dir", help="the builds folder: an analysis reached through a symbolic link is "
                                        "rewritten only when the link's target lies under it "
                                        "(default $QFOLD_BUILDS or ./builds)")
    p.set_defaults(func=cmd_reanalyze)


def cmd_reanalyze(args) -> int:
    for path in args.paths:
        a = reanalyze(path, args.builds_dir)
        print(f"{path}: {a.summary.total_ops:,} ops, {a.bytes_per_token.total:,} B/token")
    return 0
