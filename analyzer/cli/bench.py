"""``bench``: time Core AI builds on the Core AI runtime in one process, interleaved, and log them.

    python -m analyzer bench TARGET [TARGET ...] [--steps N] [--rounds R] [--warmup W] [--label L ...]
                             [--phase decode,prefill --q-len N] [--compute-units cpu]
                             [--out log.csv] [--profile-out P.json] [--json]

Each TARGET is a Core AI build folder or a ``.aimodel``; its log label defaults to the build's label, as the dashboard's
pickers show it (so the log maps back to the build on the Device logs page; a ``.aimodel`` outside a build: its name).
Prints decode tok/s per target (median and spread over
the rounds), the top ops by profiled time joined to qfold's op records, time by byte category and the machine;
``--out`` writes one qfold-schema log row per target (``fit`` and the Device logs page read it), ``--profile-out``
the per-op join as JSON. Each row has its time ratio to the first target of its phase with a confidence interval
from the interleaved rounds (``measure.bench.RATIO_METHOD``), its time to first token with ``--q-len`` and its peak
memory on the runtime (``MEMORY_METHOD``). On Linux the runtime is CPU-only and single-threaded.
"""

from __future__ import annotations

import json
import sys

from analyzer import fmt
from analyzer.cli.common import positive_int
from analyzer.convert.builds_folder import bench_lock
from analyzer.convert.launch import builds_dir
from analyzer.engines.coreai.runtime import COMPUTE_UNITS
from analyzer.errors import CoreAIRuntimeError
from analyzer.fsio import write_text_atomic
from analyzer.measure.bench import MEMORY_METHOD, RATIO_METHOD, log_csv, profile_json, run_bench
from analyzer.report.labels import bench_label


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="time Core AI builds on the Core AI runtime (interleaved rounds) and log them",
                       description="Time Core AI builds on the Core AI runtime in one process (interleaved rounds), "
                                   "profile their ops against qfold's op records, and log one row per build.")
    p.add_argument("targets", nargs="+", metavar="TARGET", help="a Core AI build folder or a .aimodel")
    p.add_argument("--steps", type=positive_int, default=8, help="decode steps per round (default 8)")
    p.add_argument("--rounds", type=positive_int, default=5, help="measured rounds, interleaved (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1)")
    p.add_argument("--label", action="append", metavar="L",
                   help="the log's build label, once per target in order (default: the build's label, as the "
                        "dashboard shows it; an .aimodel outside a build: its name)")
    p.add_argument("--out", metavar="log.csv", help="write one qfold-schema log row per target")
    p.add_argument("--profile-out", metavar="P.json", help="write the per-op profile joined to op records")
    p.add_argument("--phase", default="decode", help="decode, prefill or decode,prefill: prefill times each decode "
                   "build's prefill build of --q-len tokens per call (built beside it) and gives time to first token")
    p.add_argument("--q-len", type=positive_int, default=None, metavar="N",
                   help="prompt tokens per prefill call (with --phase prefill); time to first token of an "
                        "N-token prompt")
    p.add_argument("--compute-units", choices=COMPUTE_UNITS, default=None,
                   help="asked of the runtime (macOS 27's Core AI specialises); on Linux the runtime is "
                        "CPU-only, so only cpu is accepted")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--builds-dir", help="the builds folder whose bench lock this run holds: one bench at a time per "
                                        "folder, the others wait (default $QFOLD_BUILDS or ./builds)")
    p.set_defaults(func=cmd_bench)


def _say(line: str) -> None:
    """A progress or waiting line on stderr (stdout keeps the report, or the one JSON object)."""
    print(line, file=sys.stderr, flush=True)


def cmd_bench(args) -> int:
    if args.warmup < 0:
        raise CoreAIRuntimeError(f"--warmup {args.warmup}: give 0 or more rounds")
    labels = args.label or [bench_label(t) for t in args.targets]  # None: resolve_target's default (the name)
    what = f"{len(args.targets)} target(s), {args.rounds} rounds of {args.steps} steps"
    phases = tuple(p.strip() for p in args.phase.split(",") if p.strip())
    with bench_lock(builds_dir(args.builds_dir), what, lambda text: _say(f"waiting: {text}")):
        result = run_bench(args.targets, labels, steps=args.steps, rounds=args.rounds, warmup=args.warmup,
                           on_progress=lambda f, text: _say(f"progress: {f:.0%} {text}"), phases=phases,
                           q_len=args.q_len, compute_units=args.compute_units)
    if args.out:
        write_text_atomic(args.out, log_csv(result))
    if args.profile_out:
        write_text_atomic(args.profile_out, json.dumps(profile_json(result), indent=1))
    if args.json:
        print(json.dumps(result.to_json()))
        return 0
    m = result.machine
    print(f"device: {m.device}; {m.compute_units}")
    for note in result.notes:
        print(f"note: {note}")
    print(fmt.table([(t.label, t.phase if t.phase == "decode" else f"prefill {t.tokens_per_call}", t.weights_dtype,
                      t.context_length, f"{t.tok_per_s_median:.2f}", f"{min(t.tok_per_s):.2f}–{max(t.tok_per_s):.2f}",
                      f"{t.ms_per_token_median:.2f}", _ratio_text(t),
                      "" if t.ttft_ms is None else f"{t.ttft_ms:,.1f}",
                      fmt.size(t.memory.peak_bytes, "auto", None) if t.memory else "not measured")
                     for t in result.targets],
                    ("build", "phase", "weights", "ctx", "tok/s", "spread", "ms/token", "× first of phase [CI]",
                     "TTFT ms", "peak memory")))
    print(f"× first: {RATIO_METHOD}")
    print(f"peak memory: {MEMORY_METHOD}")
    for t in result.targets:
        if t.ttft_ms is not None:
            print(f"TTFT of {t.label}: {t.ttft_how}")
    for t in result.targets:
        print(f"\n{t.label}: {t.join}")
        cats = sorted(t.time_by_category_ms.items(), key=lambda kv: -kv[1])
        print("  ms/token by byte category: " + ", ".join(f"{k} {v:.3f}" for k, v in cats if v > 0))
        if t.ops:
            print(fmt.table([(o.index, o.type.removeprefix("coreai."), o.layer if o.layer is not None else "-",
                              o.category, f"{o.time_ms:.3f}", fmt.mib(o.bytes_per_token)) for o in t.ops[:10]],
                            ("op", "type", "layer", "category", "ms/token", "bytes/token")))
    for what, path in (("log", args.out), ("profile", args.profile_out)):
        if path:
            print(f"wrote {what} {path}")
    return 0


def _ratio_text(t) -> str:
    if t.ratio is None:
        return "×1.00"
    r = t.ratio
    return f"×{r.median:.2f} [{r.low:.2f}, {r.high:.2f}] {r.level:.0%}"
