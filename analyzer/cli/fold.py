"""``fold``: remove KV replication from any ML Program package (the ``qfold::fold_gqa_replication`` pass).

    python -m analyzer fold IN.mlpackage OUT.mlpackage [--json] [--steps N] [--seed S] [--input-spec SPEC.json]

Writes the folded package to OUT and reports the tiles found / folded / left (with the reason for each tile
left), bytes per decode token before and after, the per-constant weight check, and the MIL interpreter's
proof (max |Δ| of every output and final state over N decode steps; "not checked" when the inputs cannot be
identified: give ``--input-spec``). Exits 0 when nothing needed folding (OUT is then a copy of IN).
"""

from __future__ import annotations

import json

from analyzer import fmt
from analyzer.cli.common import positive_int


def add_parser(sub) -> None:
    p = sub.add_parser("fold", help="fold the KV replication out of any .mlpackage (GQA/MQA), with proof",
                       description="Rewrite every tile that copies K/V for attention into the Q-folded form "
                                   "(no copy), save the result, and prove it in the MIL interpreter.")
    p.add_argument("input", help="an ML Program .mlpackage (or a build folder holding one)")
    p.add_argument("output", help="where to write the folded .mlpackage (replaced if it exists)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--steps", type=positive_int, default=4, help="decode steps of the interpreter proof (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the proof's random inputs")
    p.add_argument("--input-spec", metavar="SPEC.json",
                   help="which inputs are token ids, positions, masks and KV caches (see `run --help`); "
                        "qfold's own builds need none")
    p.add_argument("--no-proof", action="store_true", help="skip the interpreter proof")
    p.add_argument("--builds-dir",
                   help="where the fold cache lives (<builds>/.folds; default $QFOLD_BUILDS or ./builds)")
    p.set_defaults(func=cmd_fold)


def cmd_fold(args) -> int:
    from pathlib import Path

    from analyzer.build.fold import copy_package, fold_cached
    from analyzer.errors import FoldError
    from analyzer.graph.mil import find_package

    src = find_package(args.input)
    out = Path(args.output)
    if out.suffix != ".mlpackage":
        raise FoldError(f"{out}: the output must end in .mlpackage")
    if out.resolve() == src.resolve():
        raise FoldError(f"{out}: the output would overwrite the input package")
    result = fold_cached(src, args.builds_dir, steps=args.steps, seed=args.seed, roles_path=args.input_spec,
                         prove=not args.no_proof)
    copy_package(result.package, out)
    rec = result.record
    doc = {"input": str(src), "output": str(out),
           "cache": {"key": result.key, "path": str(result.path), "reused": result.reused},
           **rec["report"], "proof": rec["proof"]}
    if args.json:
        print(json.dumps(doc))
        return 0
    _print(doc)
    return 0


def _print(doc: dict) -> None:
    if not doc["changed"]:
        print(f"{doc['input']}: nothing to fold ({doc['tiles_found']} tile ops, none copies K/V for attention); "
              f"{doc['output']} is a copy")
    else:
        print(f"{doc['input']}: {doc['tiles_found']} tile ops found, {doc['tiles_folded']} folded, "
              f"{doc['tiles_left']} left")
    if doc["tiles"]:
        print(fmt.table([(t["function"], t["name"], str(list(t["input_shape"])), str(list(t["output_shape"])),
                          "folded" if t["folded"] else "left", t["mapping"], t["chain"] or t["reason"]
                          if t["folded"] else t["reason"]) for t in doc["tiles"]],
                        ("function", "tile", "input", "output", "", "head mapping", "chain / reason")))
    for f in doc["functions"]:
        print(f"\nbytes per decode token, function {f['function']} (kv_replication tiles "
              f"{f['kv_replication_tiles_before']} → {f['kv_replication_tiles_after']})")
        b, a = f["before"], f["after"]
        print(fmt.table([(k, b[k], a[k], a[k] - b[k], fmt.mib(a[k] - b[k])) for k in b],
                        ("category", "before", "after", "delta", "delta MiB")))
    w = doc["weights"]
    if w is not None:
        print(f"\nweights: {w['identical']:,} of {w['checked']:,} stored constants identical (dtype, shape, bytes)"
              + (f"; {len(w['removed'])} no longer read: {', '.join(w['removed'][:3])}" if w["removed"] else ""))
    print(f"equivalence: {doc['proof']['headline']}")
    cache = doc["cache"]
    print(f"wrote {doc['output']} ({'reused' if cache['reused'] else 'new'} fold {cache['key']} in {cache['path']})")
