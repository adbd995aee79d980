"""What every subcommand shares: the one-line argument errors and the argument types."""

from __future__ import annotations

import argparse


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
