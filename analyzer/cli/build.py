"""``build``: convert a model's decode step with one or more attention variants (one child process, cached)."""

from __future__ import annotations

import sys

from analyzer.cli.common import positive_int


def add_parser(sub) -> None:
    from analyzer.build.builds import ANALYSIS_MODE, BUILD_MODES
    from analyzer.model.sources import DEFAULT_PRESET, preset_names
    from analyzer.model.variants import KV_MODES, VARIANTS

    p = sub.add_parser("build", help="convert a model to Core ML with one or more attention variants",
                       description="Convert the decode step of a model to Core ML (iOS18, fp16) with one or more "
                                   "attention variants, in one child process; reuse existing identical builds. "
                                   "Analysis mode (the default) needs no weight values and keeps no package; "
                                   "materialised mode keeps a runnable .mlpackage.")
    p.add_argument("--model", default=DEFAULT_PRESET,
                   help=f"preset ({', '.join(preset_names())}), a config.json path, or a local HF model folder "
                        "(its *.safetensors weights are loaded; never pickle, never remote code)")
    p.add_argument("--variant", required=True, nargs="+", choices=sorted(VARIANTS),
                   help="one or more variants; several (an A/B) are converted by one child process sharing the "
                        "model; one build folder per variant is printed, in order")
    p.add_argument("--mode", default=ANALYSIS_MODE, choices=list(BUILD_MODES),
                   help="; ".join(f"{m}: {d}" for m, d in BUILD_MODES.items()) + f" (default {ANALYSIS_MODE})")
    p.add_argument("--kv", default="state", choices=KV_MODES, help="KV cache as Core ML state (default) or inputs")
    p.add_argument("--ctx", type=positive_int, default=4096, help="context length (cache slots), default 4096")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field (repeatable), e.g. --set num_key_value_heads=4")
    p.add_argument("--structure", action="store_true",
                   help="shrink hidden/intermediate/vocab sizes but keep layers and attention geometry "
                        "(same tiles and tile bytes, ~20x faster)")
    p.add_argument("--compression", metavar="SPEC",
                   help="weight compression: a preset (base, top8, top12) or a spec; see `compression --help`")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (no safetensors)")
    p.add_argument("--steps", type=positive_int, default=8, help="decode steps of the equivalence check")
    p.add_argument("--builds-dir", help="where builds live (default: $QFOLD_BUILDS or ./builds)")
    p.set_defaults(func=cmd_build)




def cmd_build(args) -> int:
    from analyzer.build.builds import BuildSpec, run_builds
    from analyzer.model.sources import STRUCTURE_OVERRIDES, geometry_of, load_config, resolve_source

    overrides = (list(STRUCTURE_OVERRIDES) if args.structure else []) + list(args.overrides)
    source = resolve_source(args.model, overrides, seed=args.seed)
    compression = None
    if args.compression:
        from analyzer.build.compress import canonical_spec

        compression = canonical_spec(args.compression, geometry_of(load_config(source)).num_layers)
    specs = [BuildSpec(source, v, args.kv, args.ctx, compression, args.steps, args.mode)
             for v in dict.fromkeys(args.variant)]

    def progress(p) -> None:
        print(f"[{p.fraction * 100:3.0f}%] {p.stage}: {p.message}", file=sys.stderr, flush=True)

    for result in run_builds(specs, args.builds_dir, on_progress=progress):
        print(f"{'reused' if result.reused else 'built'} {result.key} in {result.seconds:.1f} s", file=sys.stderr)
        print(result.path)
    return 0
