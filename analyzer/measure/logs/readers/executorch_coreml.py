"""ExecuTorch's Core ML static-cache LLM runner (pytorch/executorch ``examples/apple/coreml/llama/run_static_llm.py``,
for models exported with ``export_static_llm_coreml.py``)::
    Input length: 32, Cache length: 992
    Prompt tokens: 6
    Prefill: 6 tokens in 0.07s
    Decode: 100 tokens in 1.60s (62.50 tok/s)

Each ``Decode`` line is a decode run at the printed tok/s. Its ``context_length`` is the static cache the graph
reads on every step, cache length + input length (= the ``max_context_len`` the runner builds the model with),
whatever the prompt; ``prompt_tokens`` comes from the ``Prefill`` line before it. ``Prefill`` prints no rate and
its time only to 0.01 s, so no prefill run is derived from it.
"""

from __future__ import annotations

import math
import re

from analyzer.measure.logs.readers.runner import LINE_PREFIX, LineReader, RunnerRow
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError

_SHAPE = re.compile(LINE_PREFIX + r"Input length:\s*(?P<input>\S+),\s*Cache length:\s*(?P<cache>\S+)\s*")
_PREFILL = re.compile(LINE_PREFIX + r"Prefill:\s*(?P<n>\S+)\s+tokens in\s+(?P<s>\S+?)s\s*")
_DECODE_ANY = re.compile(LINE_PREFIX + r"Decode:.*\btok/s\b.*")
_DECODE = re.compile(LINE_PREFIX + r"Decode:\s*(?P<n>\S+)\s+tokens in\s+(?P<s>\S+?)s\s+"
                     r"\((?P<tps>\S+)\s+tok/s\)\s*")
RUNNER = "ExecuTorch Core ML static LLM"


def detect(text: str) -> bool:
    return any(_DECODE_ANY.fullmatch(line) for line in text.splitlines())


def read(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    rows: list[RawRow] = []
    shape: tuple[int, int, int] | None = None  # (input_len, cache_len, line)
    prefill: tuple[int, int] | None = None  # (prompt tokens, line)
    for line, raw in enumerate(text.splitlines(), start=1):
        if match := _SHAPE.fullmatch(raw):
            reader = LineReader(col, line, None)
            input_len, cache_len = reader.count("Input length", match["input"]), reader.count("Cache length",
                                                                                              match["cache"])
            shape = (input_len, cache_len, line) if input_len is not None and cache_len is not None else None
            continue
        if match := _PREFILL.fullmatch(raw):
            n = LineReader(col, line, None).count("Prefill tokens", match["n"])
            prefill = (n, line) if n is not None else None
            continue
        if not _DECODE_ANY.fullmatch(raw):
            continue
        record = col.next_record()
        if record > limits.max_rows:
            raise RejectError(f"more than {limits.max_rows:,} Decode lines (limit); split the file", line=line)
        reader = LineReader(col, line, record)
        match = _DECODE.fullmatch(raw)
        if not match:
            reader.error(None, raw.strip(), "not a complete Decode line: expected 'Decode: N tokens in Ts (X tok/s)'")
            continue
        n = reader.count("Decode tokens", match["n"])
        seconds = reader.decimal("seconds", match["s"])
        tps = reader.decimal("tok/s", match["tps"])
        if not reader.ok or n is None or seconds is None or tps is None:
            continue
        if n == 0:
            col.n_skipped += 1
            col.add(line, "Decode tokens", "0", "warning", "skipped: 0 tokens decoded, no throughput to read")
            continue
        # Seconds and tok/s are printed to 0.01: the true time is within ±0.005 s of the printed one.
        low = n / (seconds + 0.005) - 0.005
        high = n / (seconds - 0.005) + 0.005 if seconds > 0.005 else math.inf
        if seconds < 0 or not low <= tps <= high:
            reader.error("tok/s", match["tps"], f"disagrees with {n} tokens in {seconds} s (= "
                         f"{n / seconds if seconds > 0 else math.inf:.2f} tok/s): the line was edited or corrupted")
            continue
        row = RunnerRow(line, record, match["tps"], "tok/s", "decode", RUNNER, lines={"Decode": line},
                        extra=[("decode_s", match["s"]), ("decode_tokens", str(n))])
        if prefill is not None:
            row.lines["Prefill"] = prefill[1]
            row.prompt_tokens = prefill[0]
            row.derived.append(("prompt_tokens", "the tokens of the Prefill line before it"))
        if shape is not None:
            input_len, cache_len, shape_line = shape
            row.lines["Input length"] = shape_line
            row.context_length = cache_len + input_len
            row.derived.append(("context_length", "cache length + input length: the static cache every decode step "
                                "reads, whatever the prompt"))
        prefill = None
        rows.append(row.raw())
    return rows
