"""``builds``: finished builds and queued or running conversions."""

from __future__ import annotations

import json

from analyzer import fmt


def add_parser(sub) -> None:
    p = sub.add_parser("builds", help="list finished builds and queued or running conversions")
    p.add_argument("--builds-dir")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_builds)


def cmd_builds(args) -> int:
    from analyzer.build.builds import list_builds, queue

    builds, q = list_builds(args.builds_dir), queue(args.builds_dir)
    if args.json:
        print(json.dumps({"builds": builds, "queue": q}))
        return 0
    print(fmt.table([(b["key"], b["summary"].get("tile_count"), b["created"]) for b in builds],
                    ("build", "tiles", "created")))
    for e in q:
        print(f"{e['state']}: {e['key']} (pid {e['pid']})")
    return 0
