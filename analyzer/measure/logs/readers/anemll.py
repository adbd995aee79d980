"""ANEMLL's chat runner for Core ML models on the Neural Engine (Anemll/Anemll ``tests/chat.py``, ``chat_loop``;
also shipped as ``chat.py`` beside every converted model)::

    Using context length: 512
    Prefill: 49.3ms (182.6 t/s)
    Inference: 47.2 t/s
    Total: Generated 120 tokens in 2.59s

``Prefill`` is a prefill run and ``Inference`` a decode run, at the printed t/s (one decimal). The model's KV
cache is a Core ML state of the converted context length, and every decode step reads all of it through a
causal mask of that length, so a decode run's ``context_length`` is the ``Using context length`` printed at
start-up (derived), whatever the prompt; without that line none is set. The prompt token count is not printed.
"""

from __future__ import annotations

import re

from analyzer.measure.logs.readers.runner import LINE_PREFIX, LineReader, RunnerRow
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError

_CONTEXT = re.compile(LINE_PREFIX + r"Using context length:\s*(?P<n>\S+)\s*")
_PREFILL = re.compile(LINE_PREFIX + r"Prefill:\s*(?P<ms>[^\s(]+?)\s*ms\s*\((?P<tps>\S+)\s+t/s\)\s*")  # ms stops at (
_INFERENCE = re.compile(LINE_PREFIX + r"Inference:\s*(?P<tps>\S+)\s+t/s\s*")
_THROUGHPUT_ANY = re.compile(LINE_PREFIX + r"(?P<kind>Prefill|Inference):.*\bt/s\b.*")
_TOTAL = re.compile(LINE_PREFIX + r"Total: Generated (?P<n>\S+) tokens in (?P<s>\S+?)s\s*")
RUNNER = "ANEMLL chat"


def detect(text: str) -> bool:
    return any(_INFERENCE.fullmatch(line) for line in text.splitlines())


def read(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    rows: list[RawRow] = []
    context: tuple[int, int] | None = None  # (context length, line)
    pending: RunnerRow | None = None  # the decode row, completed by the Total line after it

    def flush() -> None:
        nonlocal pending
        if pending is not None:
            rows.append(pending.raw())
            pending = None

    for line, raw in enumerate(text.splitlines(), start=1):
        if match := _CONTEXT.fullmatch(raw):
            n = LineReader(col, line, None).count("context length", match["n"])
            context = (n, line) if n is not None else None
            continue
        if (match := _TOTAL.fullmatch(raw)) and pending is not None:
            n = LineReader(col, line, None).count("Generated tokens", match["n"])
            if n is not None:
                pending.lines["Total"] = line
                pending.extra += [("generated_tokens", str(n)), ("total_s", match["s"])]
            flush()
            continue
        kind = _THROUGHPUT_ANY.fullmatch(raw)
        if not kind:
            continue
        flush()
        record = col.next_record()
        if record > limits.max_rows:
            raise RejectError(f"more than {limits.max_rows:,} throughput lines (limit); split the file", line=line)
        reader = LineReader(col, line, record)
        is_decode = kind["kind"] == "Inference"
        match = (_INFERENCE if is_decode else _PREFILL).fullmatch(raw)
        if not match:
            expected = "Inference: X t/s" if is_decode else "Prefill: T ms (X t/s)"
            reader.error(None, raw.strip(), f"not a complete ANEMLL line: expected '{expected}'")
            continue
        if reader.decimal("t/s", match["tps"]) is None:
            continue
        row = RunnerRow(line, record, match["tps"], "t/s", "decode" if is_decode else "prefill", RUNNER,
                        lines={kind["kind"]: line})
        if not is_decode:
            if reader.decimal("ms", match["ms"]) is None:
                continue
            row.extra.append(("prefill_ms", match["ms"]))
            rows.append(row.raw())
            continue
        if context is not None:
            row.lines["Using context length"] = context[1]
            row.context_length = context[0]
            row.derived.append(("context_length", "the converted context length ('Using context length'): the "
                                "static KV cache state every decode step reads through its causal mask"))
        pending = row
    flush()
    return rows
