"""llama.cpp's timing summary, found anywhere in a raw text log (llama-cli, llama-simple, llama-server …).

The lines, as printed by ``llama_perf_context_print`` (ggml-org/llama.cpp ``src/llama-context.cpp``; before
2024-09 ``llama_print_timings`` in ``llama.cpp``, same layout) and by llama-server's ``print_timing``::

    llama_perf_context_print: prompt eval time =  120.13 ms /  22 tokens ( 5.46 ms per token, 183.14 tokens per second)
    llama_perf_context_print:        eval time = 1033.47 ms /  62 runs   (16.67 ms per token,  59.99 tokens per second)

A ``prompt eval`` line is a prefill run; an ``eval`` line a decode run. The tok/s read is the printed
``tokens per second``; it must agree with N / T (else the line was edited or corrupted). A decode run's
``context_length`` is derived: the prompt eval tokens before it + its eval runs, the KV positions its last
token attends over, assuming the session started from an empty cache (llama.cpp's counters cover the whole
session). ``sample time`` / ``sampling time`` lines time the sampler, not the model, and are not read.
"""

from __future__ import annotations

import re

from analyzer.measure.logs.readers.runner import LineReader, RunnerRow, agrees
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError

_KIND = re.compile(r"(?P<prefix>[^=]*?)\b(?P<kind>prompt eval|eval) time\s*=")
# Each value excludes the delimiter after it (/ ( , )), so it cannot reach into the next field: with plain \S+ the
# four values could split one long run of "1ms/1runs(…" in O(n³) ways before failing (a 12 kB line took 79 s).
_VALUES = re.compile(r"\s*(?P<ms>[^\s/]+?)\s*ms\s*/\s*(?P<n>[^\s(]+?)\s*(?P<unit>runs|tokens)\s*\(\s*"
                     r"(?P<ms_per>[^\s,]+?)\s*ms per token,\s*(?P<tps>[^\s)]+?)\s*tokens per second\s*\)\s*")
RUNNER = "llama.cpp"


def detect(text: str) -> bool:
    return any(_KIND.match(line) and "tokens per second" in line for line in text.splitlines())


def read(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    rows: list[RawRow] = []
    prompt: tuple[int, int] | None = None  # (tokens, line) of the last prompt eval line not yet followed by eval
    for line, raw in enumerate(text.splitlines(), start=1):
        kind = _KIND.match(raw)
        if not kind:
            continue
        record = col.next_record()
        if record > limits.max_rows:
            raise RejectError(f"more than {limits.max_rows:,} timing lines (limit); split the file", line=line)
        reader = LineReader(col, line, record)
        values = _VALUES.fullmatch(raw, kind.end())
        if not values:
            reader.error(None, raw.strip(), "not a complete llama.cpp timing line: expected "
                         "'= T ms / N runs|tokens (x ms per token, y tokens per second)'")
            continue
        is_prompt = kind["kind"] == "prompt eval"
        n = reader.count("prompt eval tokens" if is_prompt else "eval runs", values["n"])
        if n == 0:
            col.n_skipped += 1
            col.add(line, "eval runs", "0", "warning", f"skipped: 0 {values['unit']}, no throughput to read")
            continue
        ms = reader.decimal("ms", values["ms"])
        tps = reader.decimal("tokens per second", values["tps"])
        if not reader.ok or n is None or ms is None or tps is None:
            continue
        if ms <= 0 or not agrees(tps, n * 1e3 / ms, 2):
            reader.error("tokens per second", values["tps"], f"disagrees with {n} {values['unit']} in {ms} ms "
                         f"(= {n * 1e3 / ms if ms > 0 else float('inf'):.2f} tok/s): the line was edited or corrupted")
            continue
        prefix = kind["prefix"].split()
        row = RunnerRow(line, record, values["tps"], "tokens per second", "prefill" if is_prompt else "decode",
                        RUNNER, extra=[("time_ms", values["ms"])])
        if prefix:
            row.extra.append(("printer", prefix[-1].rstrip(":")))
        if is_prompt:
            prompt = (n, line)
            row.lines["prompt eval time"] = line
            row.prompt_tokens = row.context_length = n
            row.derived += [("prompt_tokens", "the prompt eval tokens"),
                            ("context_length", "the prompt eval tokens: the KV positions the last prompt token "
                                               "attends over, from an empty cache")]
        else:
            row.lines["eval time"] = line
            row.extra.append(("eval_runs", str(n)))
            if prompt is not None:
                row.lines["prompt eval time"] = prompt[1]
                row.prompt_tokens, row.context_length = prompt[0], prompt[0] + n
                row.derived += [("prompt_tokens", "the prompt eval tokens before it"),
                                ("context_length", "prompt eval tokens + eval runs: the KV positions the last "
                                 "generated token attends over, assuming the session started from an empty cache")]
            prompt = None
        rows.append(row.raw())
    return rows
