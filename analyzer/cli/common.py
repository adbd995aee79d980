"""What every subcommand shares: the one-line argument errors, the argument types, and how a path on the
command line becomes analyses."""

from __future__ import annotations

import argparse

from analyzer.analysis.byte_account import DEFAULT_WEIGHT_CHARGE, WEIGHT_CHARGES
from analyzer.analysis.record import load_analyses, load_analysis
from analyzer.analysis.shapes import check_names, parse_shape_args


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
    """The analyses a path names: one per function of a package unless ``--function`` picks one."""

    shapes = shapes_of(args)
    if args.function:
        return (load_analysis(path, args.function, args.weight_charge, shapes),)
    return load_analyses(path, args.weight_charge, shapes)
