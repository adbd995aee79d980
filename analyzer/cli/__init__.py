"""``python -m analyzer``: everything the dashboard does, headless.

Contract (scripts depend on these names):
  build --model M --variant {repeat_kv,qfold} [...] [--mode {analysis,materialised}] [--kv {state,input}]
        [--ctx N] [--set K=V ...] [--compression SPEC]   one build folder per variant, in order, on stdout
        (one variant: the last stdout line is its folder)
  inspect PATH [--json] [--ops] [--csv]   PATH: a build folder, an analysis.json or any .mlpackage
  diff A B [--json]
  fit LOG [LOG ...] [--build LABEL=BUILD_PATH ...] [--bw BYTES_PER_S] [--overhead] [--json]
Bad arguments and failed steps exit non-zero with one line on stderr, no traceback.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from analyzer.cli.common import Parser
from analyzer.errors import QfoldError

# Every subcommand, in --help order: a module ``analyzer.cli.<name>`` with ``add_parser(subparsers)`` that sets
# ``func``. Imported directly: a broken subcommand is an error, never silently missing.
COMMANDS: tuple[str, ...] = ("build", "inspect", "diff", "fit", "compression", "reanalyze", "presets", "builds")


def make_parser() -> Parser:
    parser = Parser(prog="python -m analyzer", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        importlib.import_module(f"analyzer.cli.{name.replace('-', '_')}").add_parser(sub)
    return parser


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
