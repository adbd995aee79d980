"""What every subcommand shares: the one-line argument errors, the argument types, and how a path on the
command line becomes analyses."""

from __future__ import annotations

import argparse

from analyzer.graph.byte_account import DEFAULT_WEIGHT_CHARGE, WEIGHT_CHARGES


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


def add_analysis_options(p: argparse.ArgumentParser) -> None:
    """``--function`` (multi-function packages) and ``--weight-charge`` (how compressed weights count)."""
    p.add_argument("--function", metavar="NAME",
                   help="one function of a multi-function package (default: every function, reported separately)")
    p.add_argument("--weight-charge", choices=WEIGHT_CHARGES, default=DEFAULT_WEIGHT_CHARGE,
                   help="compressed weights per token: as stored (compressed, the default) or as the dense tensors "
                        "Core ML makes at load time (decompressed)")


def load_for_cli(path: str, args: argparse.Namespace):
    """The analyses a path names: one per function of a package unless ``--function`` picks one."""
    from analyzer.graph.record import load_analyses, load_analysis

    if args.function:
        return (load_analysis(path, args.function, args.weight_charge),)
    return load_analyses(path, args.weight_charge)
