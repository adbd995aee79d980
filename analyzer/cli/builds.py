"""``builds``: finished builds and queued or running conversions."""

from __future__ import annotations

import json

from analyzer import fmt
from analyzer.convert.builds_folder import queue
from analyzer.convert.launch import build_folder, builds_dir, list_builds


def add_parser(sub) -> None:
    p = sub.add_parser("builds", help="list finished builds and queued or running conversions")
    p.add_argument("--builds-dir")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_builds)


def cmd_builds(args) -> int:
    builds, q = list_builds(args.builds_dir), queue(builds_dir(args.builds_dir))
    if args.json:
        print(json.dumps({
            "builds": [{"key": a.build.key, "path": str(build_folder(a)), "created": a.build.created,
                        "spec": a.build.spec.to_json(), "summary": a.summary.to_json()} for a in builds if a.build],
            "queue": [e.to_json() for e in q],
        }, allow_nan=False))
        return 0
    print(fmt.table([(a.build.key, a.summary.tile_count, a.build.created) for a in builds if a.build],
                    ("build", "tiles", "created")))
    for e in q:
        print(f"{e.state}: {e.key} (pid {e.pid})")
    return 0
