"""``presets``: the model presets and the configs they cite."""

from __future__ import annotations

import json
from dataclasses import asdict

from analyzer import fmt
from analyzer.model.sources import list_presets


def add_parser(sub) -> None:
    p = sub.add_parser("presets", help="list the model presets and where their configs come from")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_presets)


def cmd_presets(args) -> int:
    presets = list_presets()
    if args.json:
        print(json.dumps([asdict(p) for p in presets]))
    else:
        print(fmt.table([(p.name, p.model_type, p.source) for p in presets], ("preset", "model_type", "source")))
    return 0
