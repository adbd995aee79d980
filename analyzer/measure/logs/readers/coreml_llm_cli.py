"""coreml-llm-cli's summary (smpanaro/coreml-llm-cli ``Sources/Kit/TextGenerator.swift``, ``generate``; main @
9d141fc6a518, the ``sequoia`` branch @ a12f09e7beee)::

    Compile + Load: 0.51 sec
    Prompt        : 726.74 ms
                    704.52 token / sec
    Generate      : 85.41 +/- 2.67 ms / token
                    11.72 +/- 0.29 token / sec

``Generate`` is a decode run: its tok/s is 1000 ÷ the mean latency per token (derived: qfold averages runs as
seconds per token), the printed mean of per-token rates (always a little higher) is kept as ``printed_tok_per_s``.
``Prompt`` is a prefill run only where a throughput line follows it (the ``sequoia`` branch: ``512 / prompt
seconds``, "Prompt always process 512 tokens", so ``prompt_tokens`` is 512, derived); main prints the prompt's
time alone, with no token count, which is warned about and not used. Numbers are Swift's
``.formatted(.number.precision(.fractionLength(2)))``: two decimals, with the en-US thousands separator
(``1,234.56``) read as such; other locales' separators are refused per line. Published output (the issue thread
smpanaro/coreml-llm-cli#1) says ``sec`` after the prompt's milliseconds; the unit is kept as printed.
"""

from __future__ import annotations

import re

from analyzer.measure.logs.readers.runner import LINE_PREFIX, LineReader, RunnerRow
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError

_NUM = r"[0-9][0-9,.]*"
_LOAD = re.compile(LINE_PREFIX + rf"Compile \+ Load:\s*(?P<s>{_NUM})\s*sec\s*")
_PROMPT = re.compile(LINE_PREFIX + rf"Prompt\s*:\s*(?P<t>{_NUM})\s*(?P<unit>ms|sec)\s*")
_GENERATE_ANY = re.compile(LINE_PREFIX + r"Generate\s*:.*")
_GENERATE = re.compile(LINE_PREFIX + rf"Generate\s*:\s*(?P<mean>{_NUM})\s*\+/-\s*(?P<std>{_NUM})\s*ms / token\s*")
_RATE = re.compile(rf"\s*(?P<tps>{_NUM})(?:\s*\+/-\s*(?P<std>{_NUM}))?\s*token / sec\s*")
_EN_GROUPED = re.compile(r"[0-9]{1,3}(?:,[0-9]{3})+(?:\.[0-9]+)?")
RUNNER = "coreml-llm-cli"
SEQUOIA_PROMPT_TOKENS = 512  # TextGenerator.swift (sequoia): "Prompt always process 512 tokens."


def detect(text: str) -> bool:
    return any(_GENERATE_ANY.fullmatch(line) and "ms / token" in line for line in text.splitlines())


def _plain(text: str) -> str:
    """``1,234.56`` → ``1234.56`` (Swift's en-US grouping); anything else as it is, for the cell parser."""
    return text.replace(",", "") if _EN_GROUPED.fullmatch(text) else text


def read(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    rows: list[RawRow] = []
    lines = text.splitlines()
    load: tuple[str, int] | None = None
    for k, raw in enumerate(lines):
        line = k + 1
        following = lines[k + 1] if k + 1 < len(lines) else ""
        if m := _LOAD.fullmatch(raw):
            load = (_plain(m["s"]), line)
            continue
        if m := _PROMPT.fullmatch(raw):
            rate = _RATE.fullmatch(following)
            if rate is None or rate["std"] is not None:
                col.add(line, "Prompt", raw.strip(), "warning", "coreml-llm-cli prints the prompt's time without its "
                        "token count (only the sequoia branch prints a prompt throughput): no prefill row")
                continue
            record = _next(col, line, limits)
            reader = LineReader(col, line + 1, record)
            if reader.decimal("token / sec", _plain(rate["tps"])) is None:
                continue
            row = RunnerRow(line, record, _plain(rate["tps"]), "token / sec", "prefill", RUNNER,
                            lines={"Prompt": line, "token / sec": line + 1}, prompt_tokens=SEQUOIA_PROMPT_TOKENS)
            row.derived.append(("prompt_tokens", "512: the sequoia branch's prompt call always processes 512 "
                                "tokens (TextGenerator.swift)"))
            row.extra.append(("prompt_time", f"{_plain(m['t'])} {m['unit']}"))
            rows.append(_with_load(row, load))
            continue
        if not _GENERATE_ANY.fullmatch(raw):
            continue
        record = _next(col, line, limits)
        reader = LineReader(col, line, record)
        m = _GENERATE.fullmatch(raw)
        if m is None:
            reader.error(None, raw.strip(), "not a complete coreml-llm-cli line: expected 'Generate : A +/- S ms / "
                         "token'")
            continue
        mean_ms = reader.decimal("ms / token", _plain(m["mean"]))
        std_ms = reader.decimal("+/- ms", _plain(m["std"]))
        if mean_ms is None or std_ms is None:
            continue
        if mean_ms <= 0:
            reader.error("ms / token", m["mean"], "the mean latency per token must be positive")
            continue
        row = RunnerRow(line, record, repr(1000.0 / mean_ms), "1000 / ms per token", "decode", RUNNER,
                        lines={"Generate": line})
        row.derived.append(("tok_per_s", "1000 / the mean ms per token (seconds per token averaged, as qfold "
                            "averages runs)"))
        row.extra += [("ms_per_token", _plain(m["mean"])), ("ms_per_token_std", _plain(m["std"]))]
        if rate := _RATE.fullmatch(following):
            row.lines["token / sec"] = line + 1
            row.extra.append(("printed_tok_per_s", _plain(rate["tps"])))
        rows.append(_with_load(row, load))
    return rows


def _next(col: Collector, line: int, limits: LogLimits) -> int:
    record = col.next_record()
    if record > limits.max_rows:
        raise RejectError(f"more than {limits.max_rows:,} throughput lines (limit); split the file", line=line)
    return record


def _with_load(row: RunnerRow, load: tuple[str, int] | None) -> RawRow:
    if load is not None:
        row.extra.append(("compile_load_s", load[0]))
        row.lines["Compile + Load"] = load[1]
    return row.raw()
