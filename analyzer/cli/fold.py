"""``fold``: remove KV replication from any ML Program package (the ``qfold::fold_gqa_replication`` pass).

    qfold fold IN.mlpackage OUT.mlpackage [--json] [--steps N] [--seed S] [--input-spec SPEC.json]
                                           [--shape NAME=D0,D1,…] [--no-proof] [--allow-unproven] [--strict]

Writes the folded package to OUT and reports the tiles found / folded / left (with the reason for each tile
left), bytes per decode token before and after, the per-constant weight check, and the MIL interpreter's
proof (max |Δ| of every output and final state over N steps: on inputs the input spec describes, the roles of
qfold's own builds, or else inputs drawn at random within what each can hold, each draw stated). A flexible
package is reported and proved at ``--shape`` (else the stated defaults). Exits 0 when nothing needed folding
(OUT is then a copy of IN).

A fold is delivered only as what its proof says (``proof.status`` in ``--json``): a proof outside the tolerance
exits 1, writes nothing and caches nothing; a proof that could not run says why (stderr, ``proof.reason``) and
exits 1 without writing OUT, unless ``--allow-unproven`` (OUT written, exit 0, a warning) or ``--no-proof``.

    qfold fold IN.aimodel OUT.aimodel [--json] [--steps N] [--seed S] [--input-spec SPEC.json]

does the same for a Core AI asset, or a Core AI build folder (its ``model.aimodel``;
``analyzer.fold.coreai.asset_fold``): the replication ops are ``coreai.broadcast_in_dims`` / ``coreai.tile`` (SDPA
composite bodies included), and the proof runs on the Core AI runtime. An asset's inputs have static shapes, so a
``--shape`` other than an input's own is refused. Core AI folds are not cached.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from analyzer import fmt
from analyzer.analysis.shapes import check_names, check_static_shapes, input_ranges
from analyzer.analysis.sizing import Sizing
from analyzer.cli.common import add_shape_option, add_strict_option, check_strict, positive_int, shapes_of, warn_unsized
from analyzer.engines.coreai.runtime import asset_in
from analyzer.engines.interpret import load_roles
from analyzer.errors import FoldError, UnsizedError
from analyzer.fold.cache import check_fold_output, copy_package, fold_cached
from analyzer.fold.coreai.asset_fold import fold_asset
from analyzer.fold.fold_records import nothing_folded
from analyzer.fold.proof import FoldProof
from analyzer.fsio import check_disjoint
from analyzer.ir.coreai.walk import read_asset
from analyzer.ir.coreml.mil_reader import find_package, list_functions


def add_parser(sub) -> None:
    p = sub.add_parser("fold", help="fold the KV replication out of any .mlpackage or .aimodel (GQA/MQA), with "
                                    "proof",
                       description="Rewrite every op that copies K/V for attention into the Q-folded form (no copy), "
                                   "save the result, and prove it: a .mlpackage in qfold's MIL interpreter, a Core "
                                   "AI .aimodel on the Core AI runtime.")
    p.add_argument("input", help="an ML Program .mlpackage, a Core AI .aimodel, or a build folder holding one")
    p.add_argument("output", help="where to write the folded .mlpackage or .aimodel (replaced if it exists)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--steps", type=positive_int, default=4,
                   help="decode steps of the proof (MIL interpreter or Core AI runtime; default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the proof's random inputs")
    p.add_argument("--input-spec", metavar="SPEC.json",
                   help="which inputs are token ids, positions, masks and KV caches (see `run --help`); "
                        "qfold's own builds need none")
    p.add_argument("--no-proof", action="store_true", help="skip the proof")
    p.add_argument("--allow-unproven", action="store_true",
                   help="write OUT and exit 0 when the proof could not run (e.g. an op the proof's engine cannot "
                        "run); without it such a fold is refused (exit 1, OUT not written) and says why. A proof "
                        "that runs and finds the fold wrong is always refused, and nothing is cached")
    add_shape_option(p)
    add_strict_option(p)
    p.add_argument("--builds-dir",
                   help="where the fold cache lives (<builds>/.folds; default $QFOLD_BUILDS or ./builds)")
    p.set_defaults(func=cmd_fold)


def cmd_fold(args) -> int:
    asset = asset_in(args.input)  # an .aimodel, or the one a Core AI build folder holds
    if asset is not None:
        return _fold_asset(args, asset)
    src = find_package(args.input)
    out = Path(args.output)
    check_fold_output(Path(args.input), out)  # a build folder given as IN is an input too
    real_out = check_fold_output(src, out)
    if args.input_spec is not None:
        load_roles(args.input_spec)  # a missing, unreadable or malformed spec is refused before any work
    shapes = shapes_of(args)
    if shapes:  # a name no input of IN has is an error (one package: it must be IN's)
        check_names(shapes, [{r.name for r in input_ranges(src, fn)} for fn in list_functions(src)])
    result = fold_cached(src, args.builds_dir, steps=args.steps, seed=args.seed, roles_path=args.input_spec,
                         prove=not args.no_proof, shapes=shapes)
    check_disjoint(result.path, real_out, FoldError)  # never the cache entry itself
    _check_figures(args, str(src), result.record["report"])  # before OUT is written
    refused = _unproven(args, src, out, FoldProof.from_json(result.record["proof"]))
    if refused is None:
        copy_package(result.artifact, real_out)
    cache = {"key": result.key, "path": str(result.path), "reused": result.reused}
    return _report(args, _document(src, out, result.record["report"], result.record["proof"], cache, refused),
                   refused)


def _unproven(args, src: Path, out: Path, proof: FoldProof) -> str | None:
    """Why OUT is not written (a fold whose proof could not run, without ``--allow-unproven``), else None; an
    unproven fold that is written is a warning. (A proof that ran and failed never gets here: the fold raised.)"""
    if proof.status != "unproven":
        return None
    if args.allow_unproven or args.no_proof:  # --no-proof: a cached fold's proof that could not run is still said
        print(f"warning: {src}: the fold is unproven: the proof could not run ({proof.reason})", file=sys.stderr)
        return None
    return (f"{src}: the fold could not be proven ({proof.reason}); {out} was not written (--allow-unproven "
            "writes an unproven fold, --no-proof skips the proof)")


def _fold_asset(args, asset: Path) -> int:
    if args.builds_dir:
        raise FoldError("--builds-dir: Core AI folds are not cached")
    shapes = shapes_of(args)
    if shapes:  # static shapes: a --shape is either the input's own or refused, never silently ignored
        program = read_asset(asset)
        check_names(shapes, [{t.name for t in program.inputs}])
        check_static_shapes(shapes, program.inputs, asset)
    check_disjoint(Path(args.input), Path(args.output), FoldError)  # a build folder given as IN is an input too
    report = fold_asset(asset, args.output, steps=args.steps, seed=args.seed, roles_path=args.input_spec,
                        prove=not args.no_proof, keep_unproven=args.allow_unproven)
    doc = report.to_json()
    _check_figures(args, str(asset), doc)
    refused = _unproven(args, asset, Path(args.output), report.proof)
    return _report(args, _document(asset, Path(args.output), doc, report.proof.to_json(), refused=refused), refused)


def _document(src: Path, out: Path, report: dict, proof: dict, cache: dict | None = None,
              refused: str | None = None) -> dict:
    """``--json``'s object, either backend: IN and OUT as given, the fold cache's entry (packages), the fold
    report (``analyzer.fold.fold_records.FoldReport.to_json``), its proof, and whether OUT was written (not when
    the fold is unproven and that is not allowed)."""
    return {"input": str(src), "output": str(out), **({"cache": cache} if cache is not None else {}), **report,
            "proof": proof, "output_written": refused is None}


def _report(args, doc: dict, refused: str | None = None) -> int:
    """The report on stdout (the why of an unproven fold in it too), then the refusal, if any, as the error."""
    if args.json:
        print(json.dumps(doc))
    else:
        _print(doc)
    if refused is not None:
        raise FoldError(refused)
    return 0


def _warn_unsized(src: str, report: dict) -> list[str]:
    """A warning per function of the report that could not be sized (its bytes before and after leave something
    out); the functions that could not."""
    functions = report["functions"]
    return warn_unsized((f"{src} (function {f['function']})" if len(functions) > 1 else src,
                         Sizing((f["unsized_reason"],) if not f["sized"] else (), ())) for f in functions)


def _check_figures(args, src: str, report: dict) -> None:
    """What the report could not settle, each a warning on stderr and, with ``--strict``, an error (exit 1, OUT not
    written): a function that could not be sized, and a KV copy left because its computed repeats were not proved
    one value over the flexible range (the folded figures hold at the stated shapes only)."""
    check_strict(args, _warn_unsized(src, report))
    left = [t for t in report["tiles"] if t["replication"] and not t["folded"] and t.get("reps_proved") is False]
    for t in left:
        print(f"warning: {src}: {t['op_type']} {t['name']!r} left in place: {t['reason']}", file=sys.stderr)
    if left and getattr(args, "strict", False):
        raise UnsizedError(f"{src}: {len(left)} KV cop{'y' if len(left) == 1 else 'ies'} left whose repeats are not "
                           "one value over the flexible range (the warnings above say which); --strict makes that "
                           "an error")


def _dims(shape) -> str:
    return "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"


def _print(doc: dict) -> None:
    what = "replication ops (broadcast_in_dims/tile)" if doc.get("backend") == "coreai" else "tile ops"
    if not doc["changed"]:
        print(f"{doc['input']}: {nothing_folded(doc)}; {doc['output']} is a copy")
    else:
        print(f"{doc['input']}: {doc['tiles_found']} {what} found, {doc['tiles_folded']} folded, "
              f"{doc['tiles_left']} left")
    if doc["tiles"]:
        print(fmt.table([(t["function"], t["name"], _dims(t["input_shape"]), _dims(t["output_shape"]),
                          "folded" if t["folded"] else "left", t["mapping"], t["chain"] or t["reason"]
                          if t["folded"] else t["reason"]) for t in doc["tiles"]],
                        ("function", "op" if doc.get("backend") == "coreai" else "tile", "input", "output", "",
                         "head mapping", "chain / reason")))
    for f in doc["functions"]:
        copies = "replication ops" if doc.get("backend") == "coreai" else "tiles"
        print(f"\nbytes per call (a decode call is one token), function {f['function']} (kv_replication {copies} "
              f"{f['kv_replication_tiles_before']} → {f['kv_replication_tiles_after']})"
              + ("" if f["sized"] else " — NOT SIZED: leaves out what could not be sized (see the warnings)"))
        b, a = f["before"], f["after"]
        print(fmt.table([(k, b[k], a[k], a[k] - b[k], fmt.mib(a[k] - b[k])) for k in b],
                        ("category", "before", "after", "delta", "delta MiB")))
    w = doc["weights"]
    if w is not None:
        print(f"\nweights: {w['identical']:,} of {w['checked']:,} stored constants identical (dtype, shape, bytes)"
              + (f"; {len(w['removed'])} no longer read: {', '.join(w['removed'][:3])}" if w["removed"] else ""))
    for draw in doc["proof"].get("draws", []):
        print(f"  drawn: {draw}")
    print(f"equivalence: {doc['proof']['headline']}")
    if not doc.get("output_written", True):
        print(f"not written: {doc['output']} (the fold is unproven)")
        return
    cache = doc.get("cache")
    if cache is None:
        print(f"wrote {doc['output']}")
        return
    print(f"wrote {doc['output']} ({'reused' if cache['reused'] else 'new'} fold {cache['key']} in {cache['path']})")
