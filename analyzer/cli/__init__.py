"""``qfold``: everything the dashboard does, headless.

Contract (scripts depend on these names):
  build --model M --variant {repeat_kv,qfold,repeat_kv+fold} [...] [--mode {analysis,materialised}]
        [--kv {state,input}] [--ctx N] [--set K=V ...] [--compression SPEC]
        [--phase {decode,prefill,decode+prefill}] [--q-len N]
                                      one build folder per variant, in order, on stdout
                                      (one variant: the last stdout line is its folder)
  inspect PATH [--json] [--ops] [--csv] [--function NAME] [--weight-charge {compressed,decompressed}] [--strict]
                                          PATH: a build folder, an analysis.json or any .mlpackage
  diff A B [--json] [--function NAME] [--weight-charge {compressed,decompressed}] [--plan A=PLAN --plan B=PLAN]
         [--plan-function A=P|B=P ...] [--strict]
  placement PLAN ANALYSIS [--function F] [--plan-function P] [--json]
  graph A [B] [--layer N|outside] [--function NAME] --out FILE.svg|FILE.dot [--no-collapse] [--strict]
                                      last stdout line: the file written
  explore TARGET [TARGET_B] [--function F] [--shape N=D,...] [--plan A=PLAN] [--plan B=PLAN] [--out DIR]
          [--port P] [--no-browser]      Model Explorer: --out writes the files and prints the command that opens
                                      them; otherwise serves them on 127.0.0.1:P (8080) until Ctrl-C, URL on stdout
  fold IN.mlpackage OUT.mlpackage [--json] [--steps N] [--seed S] [--input-spec SPEC.json] [--no-proof]
       [--allow-unproven] [--strict]
  fold IN.aimodel OUT.aimodel [--json] [--steps N] [--seed S] [--input-spec SPEC.json] [--no-proof]
       [--allow-unproven] [--strict]
                                          IN: also a Core AI build folder (its model.aimodel); a proof outside
                                          tolerance exits 1 (nothing written or cached); one that cannot run
                                          exits 1 unless --allow-unproven or --no-proof
  A figure that could not be computed (a flexible program the interpreter cannot size, a copy op without a size or
  a verdict) is a warning on stderr, sized: false in --json; --strict makes it an error (exit 1). So is, for fold,
  a KV copy left because its computed repeats differ over the flexible range (tiles[].reps_proved false).
  run PKG --inputs IN.npz --out OUT.npz [--states S.npz] [--function NAME]
      (or --steps N [--input-spec SPEC.json] [--seed S] instead of --inputs: N seeded decode steps)
      PKG: a .mlpackage (MIL interpreter), a .aimodel (Core AI runtime) or a build folder holding one
  bench TARGET [TARGET ...] [--steps N] [--rounds R] [--warmup W] [--label L ...] [--out log.csv]
        [--profile-out P.json] [--json]      TARGET: a Core AI build folder or .aimodel
                                          --label default: the build's label (as the dashboard shows it)
  fit LOG [LOG ...] [--build LABEL=BUILD_PATH ...] [--bw BYTES_PER_S] [--overhead] [--keep-impossible] [--json]
  sweep --model M [--model M2 ...] --ctx 512,1024 --variant repeat_kv,qfold [--compression SPEC ...]
        [--phase decode,prefill] [--q-len N] [--structure] [--set K=V ...] [--address ADDR] --out TABLE.csv
                                      last stdout line: the table
Bad arguments and failed steps exit non-zero with one line on stderr, no traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from analyzer import quiet_coremltools
from analyzer.cli.common import Parser
from analyzer.errors import QfoldError

# Every subcommand, in --help order: a module ``analyzer.cli.<name>`` with ``add_parser(subparsers)`` that sets
# ``func``. Imported by name: a broken subcommand is an error, never silently missing.
COMMANDS: tuple[str, ...] = ("build", "inspect", "diff", "placement", "graph", "explore", "fold", "run", "bench", "fit",
                             "sweep",
                             "compression", "reanalyze", "presets", "builds")


def make_parser(only: str | None = None) -> Parser:
    """The parser of every subcommand, or of ``only`` (a command being run imports its own module alone, so
    ``qfold presets`` or ``qfold inspect`` never pay for torch and coremltools, which ``build`` and ``fold``
    need)."""
    parser = Parser(prog="qfold", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in (only,) if only in COMMANDS else COMMANDS:
        importlib.import_module(f"analyzer.cli.{name.replace('-', '_')}").add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    quiet_coremltools()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = make_parser(argv[0] if argv else None)
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
