"""``python -m analyzer``: everything the dashboard does, headless.

Contract (scripts depend on these names):
  build --model M --variant {repeat_kv,qfold} [--kv {state,input}] [--ctx N] [--set K=V ...]
        [--compression SPEC]          last stdout line: the build folder
  inspect PATH [--json] [--ops] [--csv]   PATH: a build folder, an analysis.json or any .mlpackage
  diff A B [--json]
  fit LOG [LOG ...] [--build LABEL=BUILD_PATH ...] [--bw BYTES_PER_S] [--overhead] [--json]
Bad arguments and failed steps exit non-zero with one line on stderr, no traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from analyzer import fmt
from analyzer.errors import QfoldError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line instead of usage + message
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _add_build(sub) -> None:
    from analyzer.builds import KV_MODES
    from analyzer.sources import DEFAULT_PRESET, preset_names
    from analyzer.variants import VARIANTS

    p = sub.add_parser("build", help="convert a model to Core ML with one attention variant",
                       description="Convert the decode step of a model to Core ML (iOS18, fp16) with one "
                                   "attention variant, in a child process; reuse an existing identical build.")
    p.add_argument("--model", default=DEFAULT_PRESET,
                   help=f"preset ({', '.join(preset_names())}), a config.json path, or a local HF model folder "
                        "(its *.safetensors weights are loaded; never pickle, never remote code)")
    p.add_argument("--variant", required=True, choices=sorted(VARIANTS))
    p.add_argument("--kv", default="state", choices=KV_MODES, help="KV cache as Core ML state (default) or inputs")
    p.add_argument("--ctx", type=_positive_int, default=4096, help="context length (cache slots), default 4096")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field (repeatable), e.g. --set num_key_value_heads=4")
    p.add_argument("--structure", action="store_true",
                   help="shrink hidden/intermediate/vocab sizes but keep layers and attention geometry "
                        "(same tiles and tile bytes, ~20x faster)")
    p.add_argument("--compression", metavar="SPEC",
                   help="weight compression: a preset (base, top8, top12) or a spec; see `compression --help`")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (no safetensors)")
    p.add_argument("--steps", type=_positive_int, default=8, help="decode steps of the equivalence check")
    p.add_argument("--builds-dir", help="where builds live (default: $QFOLD_BUILDS or ./builds)")
    p.set_defaults(func=cmd_build)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def cmd_build(args) -> int:
    from analyzer.builds import BuildSpec, run_build
    from analyzer.sources import STRUCTURE_OVERRIDES, geometry_of, load_config, resolve_source

    overrides = (list(STRUCTURE_OVERRIDES) if args.structure else []) + list(args.overrides)
    source = resolve_source(args.model, overrides, seed=args.seed)
    compression = None
    if args.compression:
        from analyzer.compress import canonical_spec

        compression = canonical_spec(args.compression, geometry_of(load_config(source)).num_layers)
    spec = BuildSpec(source, args.variant, args.kv, args.ctx, compression, args.steps)

    def progress(p) -> None:
        print(f"[{p.fraction * 100:3.0f}%] {p.stage}: {p.message}", file=sys.stderr, flush=True)

    result = run_build(spec, args.builds_dir, on_progress=progress)
    print(f"{'reused' if result.reused else 'built'} {result.key} in {result.seconds:.1f} s", file=sys.stderr)
    print(result.path)
    return 0


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="op counts, tiles and bytes per token of a build or any .mlpackage")
    p.add_argument("path", help="a build folder, an analysis.json, or any ML Program .mlpackage")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--ops", action="store_true", help="include the per-op byte table")
    p.add_argument("--csv", action="store_true", help="print the per-op byte table as CSV")
    p.set_defaults(func=cmd_inspect)


def inspect_document(path: str, with_ops: bool) -> tuple[dict[str, Any], list[dict]]:
    from analyzer.accounting import account
    from analyzer.analysis import load_program

    program, doc = load_program(path)
    s = doc["summary"]
    out = {
        "path": str(path),
        "total_ops": s["total_ops"],
        "const_ops": s["const_ops"],
        "non_const_ops": s["non_const_ops"],
        "op_counts": s["op_counts"],
        "tiles": s["tiles"],
        "tile_count": s["tile_count"],
        "tile_output_bytes": s["tile_output_bytes"],
        "bytes_per_token": doc["bytes"]["bytes_per_token"],
        "bytes_by_layer": doc["bytes"]["bytes_by_layer"],
        "unruled_op_types": doc["bytes"]["unruled_op_types"],
    }
    for key in ("key", "spec", "geometry", "equivalence", "timings", "peak_rss_bytes", "compression_report"):
        if key in doc:
            out[key] = doc[key]
    rows = account(program).op_rows() if with_ops else []
    if with_ops:
        out["ops"] = rows
    return out, rows


def cmd_inspect(args) -> int:
    from analyzer.accounting import OP_COLUMNS

    doc, rows = inspect_document(args.path, args.ops or args.csv)
    if args.csv:
        sys.stdout.write(fmt.to_csv(rows, OP_COLUMNS))
        return 0
    if args.json:
        print(json.dumps(doc))
        return 0
    print(f"{doc['path']}: {doc['total_ops']:,} ops ({doc['const_ops']:,} const, {doc['non_const_ops']:,} other)")
    print(fmt.table([(t, n) for t, n in doc["op_counts"].items()], ("op type", "count")))
    print(f"\n{doc['tile_count']} tile ops, {fmt.bytes_both(doc['tile_output_bytes'])} of output")
    if doc["tiles"]:
        print(fmt.table([(t["layer"], t["name"], str(t["input_shape"]), str(t["output_shape"]), t["dtype"],
                          t["output_bytes"], t["kind"]) for t in doc["tiles"]],
                        ("layer", "name", "input", "output", "dtype", "bytes", "kind")))
    b = doc["bytes_per_token"]
    print("\nbytes per decode token")
    print(fmt.table([(k, b[k], fmt.mib(b[k])) for k in b], ("category", "bytes", "MiB")))
    if doc["unruled_op_types"]:
        print(f"\nop types with no byte rule (charged as generic compute): {', '.join(doc['unruled_op_types'])}")
    if args.ops:
        print()
        print(fmt.table([[r[c] for c in OP_COLUMNS] for r in rows], OP_COLUMNS))
    return 0


def _add_diff(sub) -> None:
    p = sub.add_parser("diff", help="A/B: op-count deltas, tiles, bytes per token")
    p.add_argument("a", help="build folder, analysis.json or .mlpackage (baseline)")
    p.add_argument("b", help="build folder, analysis.json or .mlpackage (candidate)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_diff)


def cmd_diff(args) -> int:
    from analyzer.analysis import load_program
    from analyzer.diff import diff_documents

    d = diff_documents(load_program(args.a)[1], load_program(args.b)[1])
    if args.json:
        print(json.dumps(d))
        return 0
    t = d["total_ops"]
    print(f"ops: {t['a']:,} → {t['b']:,} ({t['delta']:+,})")
    print(fmt.table([(r["type"], r["a"], r["b"], r["delta"]) for r in d["op_count_deltas"]],
                    ("op type", "A", "B", "delta")))
    tc = d["tile_count"]
    print(f"\ntiles: {tc['a']} → {tc['b']}; tile output removed: {fmt.bytes_both(d['tile_bytes_removed'])}")
    print("\nbytes per decode token")
    print(fmt.table([(k, v["a"], v["b"], v["delta"]) for k, v in d["bytes_per_token"].items()],
                    ("category", "A", "B", "delta")))
    return 0


def _add_reanalyze(sub) -> None:
    p = sub.add_parser("reanalyze", help="walk a build's saved .mlpackage again and rewrite its analysis.json")
    p.add_argument("paths", nargs="+", help="build folders")
    p.set_defaults(func=cmd_reanalyze)


def cmd_reanalyze(args) -> int:
    from analyzer.analysis import reanalyze_build

    for path in args.paths:
        doc = reanalyze_build(path)
        print(f"{path}: {doc['summary']['total_ops']:,} ops, {doc['bytes']['bytes_per_token']['total']:,} B/token")
    return 0


def _add_presets(sub) -> None:
    p = sub.add_parser("presets", help="list the model presets and where their configs come from")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_presets)


def cmd_presets(args) -> int:
    from dataclasses import asdict

    from analyzer.sources import list_presets

    presets = list_presets()
    if args.json:
        print(json.dumps([asdict(p) for p in presets]))
    else:
        print(fmt.table([(p.name, p.model_type, p.source) for p in presets], ("preset", "model_type", "source")))
    return 0


def _add_builds(sub) -> None:
    p = sub.add_parser("builds", help="list finished builds and queued or running conversions")
    p.add_argument("--builds-dir")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_builds)


def cmd_builds(args) -> int:
    from analyzer.builds import list_builds, queue

    builds, q = list_builds(args.builds_dir), queue(args.builds_dir)
    if args.json:
        print(json.dumps({"builds": builds, "queue": q}))
        return 0
    print(fmt.table([(b["key"], b["summary"].get("tile_count"), b["created"]) for b in builds],
                    ("build", "tiles", "created")))
    for e in q:
        print(f"{e['state']}: {e['key']} (pid {e['pid']})")
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m analyzer", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_build(sub)
    _add_inspect(sub)
    _add_diff(sub)
    _add_reanalyze(sub)
    _add_presets(sub)
    _add_builds(sub)
    for extra in _EXTRA_COMMANDS:
        extra(sub)
    return parser


def _extra_commands():
    out = []
    try:
        from analyzer.fit_cli import add_fit_parser

        out.append(add_fit_parser)
    except ImportError:
        pass
    try:
        from analyzer.compress import add_compression_parser

        out.append(add_compression_parser)
    except ImportError:
        pass
    return out


_EXTRA_COMMANDS = _extra_commands()


def main(argv: Sequence[str] | None = None) -> int:
    from analyzer import quiet_coremltools

    quiet_coremltools()
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except QfoldError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
