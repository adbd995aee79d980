"""What every subcommand shares: the one-line argument errors, the argument types, and how a path on the
command line becomes analyses."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from analyzer.analysis.byte_account import DEFAULT_WEIGHT_CHARGE, WEIGHT_CHARGES
from analyzer.analysis.record import load_analyses, load_analysis
from analyzer.analysis.shapes import check_names, parse_shape_args
from analyzer.analysis.sizing import Sizing
from analyzer.errors import UnsizedError


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line instead of usage + message
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


SHAPE_HELP = ("NAME=D0,D1,…: the shape to analyse a flexible input at (repeatable; within its range; applies to "
              "every package given that has the input). Default: query lengths at their lower bound, contexts at "
              "their upper bound, an enumerated input at its default; any other flexible input must be given")


def add_shape_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,…", help=SHAPE_HELP)


def shapes_of(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    """The parsed ``--shape`` values (a malformed one is a ShapeError, one line)."""
    return parse_shape_args(getattr(args, "shape", None))


def check_shape_names(args: argparse.Namespace, *programs) -> None:
    """Each ``--shape`` name must be an input of at least one of the command's programs."""
    check_names(shapes_of(args), [{t.name for t in p.inputs} for p in programs])


def add_analysis_options(p: argparse.ArgumentParser) -> None:
    """``--function`` (multi-function packages), ``--weight-charge`` (how compressed weights count) and
    ``--shape`` (flexible inputs)."""
    add_shape_option(p)
    p.add_argument("--function", metavar="NAME",
                   help="one function of a multi-function package (default: every function, reported separately)")
    p.add_argument("--weight-charge", choices=WEIGHT_CHARGES, default=DEFAULT_WEIGHT_CHARGE,
                   help="compressed weights per token: as stored (compressed, the default) or as the dense tensors "
                        "Core ML makes at load time (decompressed)")


def load_for_cli(path: str, args: argparse.Namespace):
    """The analyses a path names: one per function of a package unless ``--function`` picks one (compressed weights
    charged as ``--weight-charge`` says, as stored for a command without it)."""

    shapes = shapes_of(args)
    charge = getattr(args, "weight_charge", DEFAULT_WEIGHT_CHARGE)
    if args.function:
        return (load_analysis(path, args.function, charge, shapes),)
    return load_analyses(path, charge, shapes)


def add_strict_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when a figure could not be computed: a flexible program the interpreter cannot size "
                        "at its shapes, a copy op without a size or a verdict, a tensor without a size (each is a "
                        "warning on stderr otherwise)")


def warn_unsized(sides: Iterable[tuple[str, Sizing]]) -> list[str]:
    """One ``warning:`` line on stderr per cause of each side (``where``: the path, the function) that could not
    be sized; returns the sides that could not."""
    unsized = []
    for where, sizing in sides:
        for reason in sizing.reasons:
            print(f"warning: {where}: {reason}", file=sys.stderr)
        if not sizing.sized:
            unsized.append(where)
    return unsized


def check_strict(args: argparse.Namespace, unsized: list[str]) -> None:
    """With ``--strict``, a side that could not be sized is an error (exit 1): scripts and CI never take a
    figure that leaves something out for a complete one."""
    if unsized and getattr(args, "strict", False):
        raise UnsizedError(f"{'; '.join(unsized)}: could not be sized (the warnings above say why); --strict makes "
                         "that an error")


def where_of(path: str, function: str, several: bool) -> str:
    """How a warning names an analysis: its path, and its function when the path has several."""
    return f"{path} (function {function})" if several else str(path)
