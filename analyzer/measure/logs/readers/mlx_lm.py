"""``mlx_lm.generate --verbose`` (ml-explore/mlx-lm, ``mlx_lm/generate.py``, function ``generate``)::

    Prompt: 7 tokens, 16.200 tokens-per-sec
    Generation: 20 tokens, 98.705 tokens-per-sec
    Peak memory: 1.065 GB

``Prompt`` is a prefill run, ``Generation`` a decode run (its tok/s is generated tokens / time since the first
token). A decode run's ``context_length`` is derived: prompt tokens + generated tokens, the KV positions the
last generated token attends over (mlx_lm's ``KVCache`` grows with the sequence; a ``--max-kv-size`` rotating
cache would cap it, which the log does not say). ``Peak memory`` is ``mx.get_peak_memory() / 1e9``, so GB means
10^9 bytes; it is kept as ``peak_memory_bytes``. Old mlx_lm versions print ``Prompt: 16.200 tokens-per-sec``
without the token count; then no context length is derived.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from analyzer.measure.logs.readers.runner import LINE_PREFIX, LineReader, RunnerRow
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError

_LINE = re.compile(LINE_PREFIX + r"(?P<kind>Prompt|Generation):(?P<rest>.*tokens-per-sec.*)")
_VALUES = re.compile(r"\s*(?:(?P<n>\S+)\s+tokens,\s*)?(?P<tps>\S+)\s+tokens-per-sec\s*")
_PEAK = re.compile(LINE_PREFIX + r"Peak memory:\s*(?P<gb>\S+)\s*GB\s*")
RUNNER = "mlx_lm"


def detect(text: str) -> bool:
    return any((m := _LINE.fullmatch(line)) and m["kind"] == "Generation" for line in text.splitlines())


@dataclass(slots=True)
class _Block:
    """One generate() call: its Prompt and Generation rows, and the peak memory printed after them."""

    prompt: RunnerRow | None = None
    prompt_tokens: int | None = None
    generation: RunnerRow | None = None
    generation_tokens: int | None = None
    extra: list[tuple[str, str]] = field(default_factory=list)

    def rows(self) -> list[RawRow]:
        out = []
        if self.prompt is not None:
            self.prompt.extra += self.extra
            out.append(self.prompt.raw())
        if self.generation is not None:
            gen = self.generation
            gen.extra += self.extra
            if self.prompt_tokens is not None:
                gen.prompt_tokens = self.prompt_tokens
                gen.derived.append(("prompt_tokens", "the token count of the Prompt line before it"))
                if self.generation_tokens is not None:
                    gen.context_length = self.prompt_tokens + self.generation_tokens
                    gen.derived.append(("context_length", "prompt + generated tokens: the KV positions the last "
                                        "generated token attends over (mlx_lm's KVCache grows with the sequence)"))
            out.append(gen.raw())
        return out


def read(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    rows: list[RawRow] = []
    block = _Block()

    def flush() -> None:
        nonlocal block
        rows.extend(block.rows())
        block = _Block()

    for line, raw in enumerate(text.splitlines(), start=1):
        peak = _PEAK.fullmatch(raw)
        if peak:
            gb = LineReader(col, line, None).decimal("Peak memory", peak["gb"])
            if gb is not None and gb >= 0:
                block.extra.append(("peak_memory_bytes", str(round(gb * 1e9))))
            flush()
            continue
        match = _LINE.fullmatch(raw)
        if not match:
            continue
        record = col.next_record()
        if record > limits.max_rows:
            raise RejectError(f"more than {limits.max_rows:,} throughput lines (limit); split the file", line=line)
        reader = LineReader(col, line, record)
        kind = match["kind"]
        if kind == "Prompt" or block.generation is not None:
            flush()
        values = _VALUES.fullmatch(match["rest"])
        if not values:
            reader.error(None, raw.strip(),
                         f"not a complete mlx_lm line: expected '{kind}: N tokens, X tokens-per-sec'")
            continue
        n = reader.count(f"{kind.lower()} tokens", values["n"]) if values["n"] is not None else None
        if n == 0:
            col.n_skipped += 1
            col.add(line, f"{kind.lower()} tokens", "0", "warning", "skipped: 0 tokens, no throughput to read")
            continue
        if reader.decimal("tokens-per-sec", values["tps"]) is None or not reader.ok:
            continue
        row = RunnerRow(line, record, values["tps"], "tokens-per-sec", "prefill" if kind == "Prompt" else "decode",
                        RUNNER, lines={kind: line})
        if kind == "Prompt":
            block.prompt, block.prompt_tokens = row, n
            if n is not None:
                row.prompt_tokens = row.context_length = n
                row.derived += [("prompt_tokens", "the Prompt line's token count"),
                                ("context_length", "the prompt tokens: the KV positions the last prompt token "
                                                   "attends over")]
        else:
            block.generation, block.generation_tokens = row, n
            if block.prompt is not None:
                row.lines["Prompt"] = block.prompt.line
            elif block.prompt_tokens is None:
                row.extra.append(("note", "no Prompt line before this Generation line"))
    flush()
    return rows
