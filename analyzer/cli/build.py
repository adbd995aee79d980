"""``build``: convert a model's decode step, prefill step or both with one or more attention variants (one child
process, cached), in analysis mode (value-free weights, no package) or materialised mode (a runnable package)."""

from __future__ import annotations

import sys

from analyzer.cli.common import positive_int
from analyzer.convert.compress import canonical_spec
from analyzer.convert.launch import run_builds, run_folded_build
from analyzer.errors import QfoldError
from analyzer.model.backends import BACKENDS, COREAI, COREML, DEFAULT_WEIGHTS, WEIGHT_DTYPES
from analyzer.model.sources import (
    DEFAULT_PRESET,
    STRUCTURE_OVERRIDES,
    geometry_of,
    load_config,
    preset_names,
    resolve_source,
)
from analyzer.model.spec import (
    ANALYSIS_MODE,
    BUILD_MODES,
    BUILD_PHASES,
    DEFAULT_Q_LEN,
    FOLD_BASE_VARIANT,
    FOLD_VARIANT,
    MATERIALISED_MODE,
    BuildSpec,
    check_fold_route,
)
from analyzer.model.variants import KV_MODES, VARIANTS


def add_parser(sub) -> None:
    p = sub.add_parser("build", help="convert a model to Core ML with one or more attention variants",
                       description="Convert the decode (or prefill) step of a model to Core ML (iOS18, fp16) with one "
                                   "or more attention variants, in one child process; reuse existing identical "
                                   "builds. Analysis mode (the default) needs no weight values and keeps no package; "
                                   "materialised mode keeps a runnable .mlpackage.")
    p.add_argument("--model", default=DEFAULT_PRESET,
                   help=f"preset ({', '.join(preset_names())}), a config.json path, or a local HF model folder "
                        "(its *.safetensors weights are loaded; never pickle, never remote code)")
    p.add_argument("--variant", required=True, nargs="+", choices=[*sorted(VARIANTS), FOLD_VARIANT],
                   help="one or more attention variants; several (an A/B) are converted by one child process sharing "
                        "the model; one build folder per variant is printed, in order. "
                        f"{FOLD_VARIANT} = the repeat_kv build plus the fold pass (one conversion, both sides of the "
                        "A/B; proven in the MIL interpreter): it needs a package, so it is always materialised")
    p.add_argument("--mode", choices=list(BUILD_MODES),
                   help="; ".join(f"{m}: {d}" for m, d in BUILD_MODES.items())
                        + f" (default {ANALYSIS_MODE}; {FOLD_VARIANT} and --backend {COREAI}: materialised)")
    p.add_argument("--backend", default=COREML, choices=list(BACKENDS),
                   help="; ".join(f"{b}: {d}" for b, d in BACKENDS.items()) + f" (default {COREML})")
    p.add_argument("--weights", default=DEFAULT_WEIGHTS, choices=list(WEIGHT_DTYPES),
                   help=f"the torch weights' dtype (default {DEFAULT_WEIGHTS}); fp32 is a {COREAI} option (time "
                        "Core AI's Linux runtime on fp32 weights: its fp16 matmuls dominate every step)")
    p.add_argument("--kv", default="state", choices=KV_MODES, help="KV cache as Core ML state (default) or inputs")
    p.add_argument("--ctx", type=positive_int, default=4096, help="context length (cache slots), default 4096")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field (repeatable), e.g. --set num_key_value_heads=4")
    p.add_argument("--structure", action="store_true",
                   help="shrink hidden/intermediate/vocab sizes but keep layers and attention geometry "
                        "(same tiles and tile bytes, ~20x faster)")
    p.add_argument("--compression", metavar="SPEC",
                   help="weight compression: a preset (base, top8, top12) or a spec; see `compression --help`")
    p.add_argument("--phase", default="decode", choices=BUILD_PHASES,
                   help="what one call does: decode one token (default), prefill --q-len prompt tokens, or both "
                        "as two functions of one package sharing their weights (decode+prefill)")
    p.add_argument("--q-len", type=positive_int, metavar="N",
                   help=f"prompt tokens per prefill call (default {DEFAULT_Q_LEN} with a prefill phase)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (no safetensors)")
    p.add_argument("--steps", type=positive_int, default=8, help="decode steps of the equivalence check")
    p.add_argument("--force-ctx", action="store_true",
                   help="build even when --ctx exceeds the model's max_position_embeddings")
    p.add_argument("--builds-dir", help="where builds live (default: $QFOLD_BUILDS or ./builds)")
    p.set_defaults(func=cmd_build)




def cmd_build(args) -> int:
    variants = list(dict.fromkeys(args.variant))
    if FOLD_VARIANT in variants and args.mode == ANALYSIS_MODE:
        raise QfoldError(f"--variant {FOLD_VARIANT} --mode {ANALYSIS_MODE}: the fold pass rewrites a saved package "
                         "and proves it in the MIL interpreter, which needs weight values; use --mode materialised "
                         f"(or leave --mode out), or compare {FOLD_BASE_VARIANT} and qfold in analysis mode")
    if FOLD_VARIANT in variants and args.backend == COREAI:
        raise QfoldError(f"--variant {FOLD_VARIANT} --backend {COREAI}: that variant folds a Core ML package; build "
                         f"{FOLD_BASE_VARIANT} with --backend {COREAI} and fold its model.aimodel with `fold`")
    # the refusals above need only the arguments: made before the config is read (which imports torch, ~5 s)
    overrides = (list(STRUCTURE_OVERRIDES) if args.structure else []) + list(args.overrides)
    source = resolve_source(args.model, overrides, seed=args.seed)
    compression = None
    if args.compression:
        compression = canonical_spec(args.compression, geometry_of(load_config(source)).num_layers)
    q_len = args.q_len if args.q_len is not None else 1 if args.phase == "decode" else DEFAULT_Q_LEN

    def spec_of(variant: str) -> BuildSpec:
        folded = variant == FOLD_VARIANT
        default = MATERIALISED_MODE if folded or args.backend == COREAI else ANALYSIS_MODE
        return BuildSpec(source, FOLD_BASE_VARIANT if folded else variant, args.kv, args.ctx, compression, args.steps,
                         args.phase, q_len, args.mode or default, backend=args.backend, weights=args.weights)

    def progress(p) -> None:
        print(f"[{p.fraction * 100:3.0f}%] {p.stage}: {p.message}", file=sys.stderr, flush=True)

    specs = {v: spec_of(v) for v in variants}
    if FOLD_VARIANT in specs:
        check_fold_route(specs[FOLD_VARIANT])
    # one child converts every variant, the folded route's repeat_kv build included; the fold runs in its own child
    built = dict(zip(variants, run_builds(list(specs.values()), args.builds_dir, on_progress=progress,
                                          force_ctx=args.force_ctx), strict=True))
    if FOLD_VARIANT in specs:
        built[FOLD_VARIANT] = run_folded_build(specs[FOLD_VARIANT], args.builds_dir, on_progress=progress)
    for v in variants:
        result = built[v]
        print(f"{'reused' if result.reused else 'built'} {result.key} in {result.seconds:.1f} s", file=sys.stderr)
        print(result.path)
    return 0
