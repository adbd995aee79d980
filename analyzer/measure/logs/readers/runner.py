"""What the runner-log readers share: a throughput line becomes one record, its numbers are checked where they
are read, and each row says which lines of the log it used.

A runner log carries no device and no build label: the user's labels fill them, else the file name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from analyzer.measure.logs.cells import nonneg_int, parse_decimal
from analyzer.measure.logs.records import Severity
from analyzer.measure.logs.rows import Collector, RawRow

LINE_PREFIX = r"\s*(?:[#>]\s*)*"
"""What may precede a runner's line when it was pasted: indentation, a shell comment ``#`` or a quote ``>``."""


@dataclass(slots=True)
class LineReader:
    """Reads numbers out of one matched line, reporting each bad one against the line's record.

    A line that only adds context to a record read elsewhere (a context length, a token count) has no record
    of its own: ``record`` None, and its problems are warnings (the rows simply go without that context).
    """

    col: Collector
    line: int
    record: int | None
    ok: bool = True

    def _report(self, column: str | None, value: str | None, message: str) -> None:
        severity: Severity = "error" if self.record is not None else "warning"
        if self.record is None:
            message += "; the line is not used"
        self.col.add(self.line, column, value, severity, message, record=self.record)
        self.ok = False

    def decimal(self, column: str, text: str) -> float | None:
        try:
            value = parse_decimal(text, column)
        except ValueError as e:
            self._report(column, text, str(e))
            return None
        if not math.isfinite(value):
            self._report(column, text, f"{column} must be finite")
            return None
        return value

    def count(self, column: str, text: str) -> int | None:
        value = nonneg_int(text)
        if value is None:
            self._report(column, text, f"{column} must be a whole number of tokens")
        return value

    def error(self, column: str | None, value: str | None, message: str) -> None:
        self._report(column, value, message)


def agrees(printed: float, computed: float, decimals: int) -> bool:
    """Whether a value printed with ``decimals`` decimals is ``computed`` up to that rounding, with 0.1%
    slack for the rounding of the inputs ``computed`` came from."""
    return abs(printed - computed) <= 0.5 * 10.0 ** -decimals + 1e-3 * abs(computed) + 1e-9


@dataclass(slots=True)
class RunnerRow:
    """A runner measurement before it becomes a RawRow: what was read, from which lines, and how."""

    line: int
    record: int
    tok_per_s: str
    tok_source: str
    phase: str
    runner: str
    lines: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int | None = None
    context_length: int | None = None
    derived: list[tuple[str, str]] = field(default_factory=list)
    extra: list[tuple[str, str]] = field(default_factory=list)

    def raw(self) -> RawRow:
        used = ", ".join(f"{what} line {n}" for what, n in self.lines.items())
        cells = {"tok_per_s": self.tok_per_s, "phase": self.phase,
                 "notes": f"{self.runner} {self.phase} run: {used}"}
        source = {"tok_per_s": self.tok_source, "phase": f"line {self.line}", "notes": "notes (generated)"}
        if self.prompt_tokens is not None:
            cells["prompt_tokens"], source["prompt_tokens"] = str(self.prompt_tokens), "prompt tokens"
        if self.context_length is not None:
            cells["context_length"], source["context_length"] = str(self.context_length), "context length"
        derived = [("phase", f"the kind of {self.runner} line it came from"), *self.derived]
        lines = ("source_lines", ",".join(str(n) for n in self.lines.values()))
        return RawRow(self.line, self.record, cells, source, (*self.extra, lines), tuple(derived))
