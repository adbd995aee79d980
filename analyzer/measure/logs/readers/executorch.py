"""ExecuTorch's LLM runner report (pytorch/executorch ``extension/llm/runner/stats.h``, ``print_report``), printed
by ``llama_main`` and the iOS/Android demo apps whatever the delegate (Core ML, MPS, XNNPACK, QNN)::

    PyTorchObserver {"prompt_tokens":31,"generated_tokens":96,...,"inference_start_ms":…,"prompt_eval_end_ms":…,
                     "inference_end_ms":…,"SCALING_FACTOR_UNITS_PER_SECOND":1000}
    I 00:00:02.721382 executorch:runner.cpp:414]  Prompt Tokens: 31    Generated Tokens: 96
    …  Prompt evaluation: 0.056000 (seconds)   Rate:  553.571429 (tokens/second)
    …  Generated 96 tokens: 1.778000 (seconds)   Rate:  53.993251 (tokens/second)

Each ``PyTorchObserver`` line is one run: a prefill row at prompt_tokens / (prompt_eval_end − inference_start)
and a decode row at generated_tokens / (inference_end − prompt_eval_end), exactly the rates ``print_report``
prints (so both are derived, and marked so). The ``Prompt evaluation`` / ``Generated N tokens`` lines repeat the
same run and are read only from logs that have no ``PyTorchObserver`` line (e.g. a device console copy).
A decode run's ``context_length`` is derived as prompt + generated tokens, the positions filled when the last
token is generated; a graph exported with a static cache reads its whole cache instead, which the log does not
say.
"""

from __future__ import annotations

import json
import re

from analyzer.fsio import bounded_int
from analyzer.measure.logs.readers.runner import LineReader, RunnerRow
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError

_OBSERVER_START = re.compile(r"\bPyTorchObserver\s+(?=\{)")
_OBSERVER_ANY = re.compile(r".*\bPyTorchObserver\b")
_TOKENS = re.compile(r".*\bPrompt Tokens:\s*(?P<prompt>\S+)\s+Generated Tokens:\s*(?P<gen>\S+)\s*")
# A value stops at the "(" of the unit after it: with \S+ two values could split one long run of
# "1(seconds)Rate:…" in O(n²) ways on every line, before any format is chosen.
_PROMPT_RATE = re.compile(r".*\bPrompt evaluation:\s*(?P<s>[^\s(]+)\s*\(seconds\)\s*Rate:\s*(?P<tps>[^\s(]+)\s*"
                          r"\(tokens/second\)\s*")
_GEN_RATE = re.compile(r".*\bGenerated (?P<n>\S+) tokens:\s*(?P<s>[^\s(]+)\s*\(seconds\)\s*Rate:\s*"
                       r"(?P<tps>[^\s(]+)\s*\(tokens/second\)\s*")
_OBSERVER_FIELDS = ("prompt_tokens", "generated_tokens", "inference_start_ms", "prompt_eval_end_ms",
                    "inference_end_ms", "SCALING_FACTOR_UNITS_PER_SECOND")
RUNNER = "ExecuTorch"


def detect(text: str) -> bool:
    return any(_OBSERVER_ANY.match(line) or _GEN_RATE.fullmatch(line) for line in text.splitlines())


def _observer_json(raw: str) -> str | None:
    """The JSON object after the line's first ``PyTorchObserver``: up to the line's last ``}``, with nothing but
    whitespace after it (found with one search and one ``rfind``: a regex ``{.*}`` would backtrack over the
    rest of the line once per ``PyTorchObserver`` on it)."""
    start = _OBSERVER_START.search(raw)
    end = raw.rfind("}")
    if start is None or end < start.end() or raw[end + 1:].strip():
        return None
    return raw[start.end():end + 1]


def _context(row: RunnerRow, prompt: int, generated: int) -> None:
    row.prompt_tokens, row.context_length = prompt, prompt + generated
    row.derived += [("prompt_tokens", "the run's prompt tokens"),
                    ("context_length", "prompt + generated tokens: the positions filled when the last token is "
                                       "generated (a graph with a static cache reads all of it instead)")]


def _observer_rows(line: int, raw: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    record = col.next_record()
    if record > limits.max_rows:
        raise RejectError(f"more than {limits.max_rows:,} runs (limit); split the file", line=line)
    reader = LineReader(col, line, record)
    text = _observer_json(raw)
    try:
        stats = json.loads(text, parse_int=bounded_int) if text is not None else None
    except (ValueError, RecursionError):  # invalid JSON, or an integer of more than MAX_INT_DIGITS digits
        stats = None
    if not isinstance(stats, dict):
        reader.error("PyTorchObserver", raw.strip(), "PyTorchObserver is not followed by a JSON object")
        return []
    values: dict[str, int] = {}
    for name in _OBSERVER_FIELDS:
        value = stats.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
            reader.error(name, None if value is None else str(value)[:80],
                         "missing" if value is None else "must be a non-negative integer")
        else:
            values[name] = value
    if not reader.ok:
        return []
    scale = values["SCALING_FACTOR_UNITS_PER_SECOND"]
    prefill_ms = values["prompt_eval_end_ms"] - values["inference_start_ms"]
    decode_ms = values["inference_end_ms"] - values["prompt_eval_end_ms"]
    prompt, generated = values["prompt_tokens"], values["generated_tokens"]
    if scale <= 0 or prefill_ms < 0 or decode_ms < 0:
        reader.error("PyTorchObserver", text, "timestamps out of order (prompt eval "
                     "must end after inference starts and before it ends) or a zero time scale")
        return []
    rows = []
    # A second record for the decode row of the same line: the line holds two runs' phases.
    decode_record = col.next_record()
    for phase, record_no, tokens, ms, how in (
            ("prefill", record, prompt, prefill_ms, "prompt_tokens / (prompt_eval_end_ms − inference_start_ms)"),
            ("decode", decode_record, generated, decode_ms,
             "generated_tokens / (inference_end_ms − prompt_eval_end_ms)")):
        if tokens == 0 or ms == 0:
            col.n_skipped += 1
            col.add(line, f"{phase} time", str(ms), "warning",
                    f"skipped the {phase} phase: {tokens} tokens in {ms} ms, no throughput to read")
            continue
        tok = tokens / (ms / scale)
        row = RunnerRow(line, record_no, repr(tok), "PyTorchObserver", phase, RUNNER,
                        lines={"PyTorchObserver": line}, extra=[(f"{phase}_ms", str(ms))])
        row.derived.append(("tok_per_s", f"{how} x {scale}, as stats.h print_report computes it"))
        if phase == "prefill":
            row.prompt_tokens = row.context_length = prompt
            row.derived += [("prompt_tokens", "the run's prompt tokens"), ("context_length", "the prompt tokens")]
        else:
            _context(row, prompt, generated)
        rows.append(row.raw())
    return rows


def read(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    lines = text.splitlines()
    if any(_OBSERVER_ANY.match(line) for line in lines):
        rows: list[RawRow] = []
        for line, raw in enumerate(lines, start=1):
            if _OBSERVER_ANY.match(raw):
                rows.extend(_observer_rows(line, raw, limits, col))
        return rows
    return _stats_rows(lines, limits, col)


def _stats_rows(lines: list[str], limits: LogLimits, col: Collector) -> list[RawRow]:
    """Logs without the JSON line: the printed rates, paired with the ``Prompt Tokens`` line before them."""
    rows: list[RawRow] = []
    tokens: tuple[int, int, int] | None = None  # (prompt, generated, line)
    for line, raw in enumerate(lines, start=1):
        counts = _TOKENS.fullmatch(raw)
        if counts:
            reader = LineReader(col, line, None)
            prompt, generated = reader.count("Prompt Tokens", counts["prompt"]), reader.count("Generated Tokens",
                                                                                              counts["gen"])
            tokens = (prompt, generated, line) if prompt is not None and generated is not None else None
            continue
        rate = _PROMPT_RATE.fullmatch(raw) or _GEN_RATE.fullmatch(raw)
        if not rate:
            continue
        record = col.next_record()
        if record > limits.max_rows:
            raise RejectError(f"more than {limits.max_rows:,} rate lines (limit); split the file", line=line)
        reader = LineReader(col, line, record)
        is_decode = rate.re is _GEN_RATE
        seconds = reader.decimal("seconds", rate["s"])
        tps = reader.decimal("Rate", rate["tps"])
        n = reader.count("Generated tokens", rate["n"]) if is_decode else None
        if not reader.ok or seconds is None or tps is None:
            continue
        row = RunnerRow(line, record, rate["tps"], "Rate", "decode" if is_decode else "prefill", RUNNER,
                        lines={"Generated" if is_decode else "Prompt evaluation": line})
        if tokens is not None:
            row.lines["Prompt Tokens"] = tokens[2]
            if is_decode:
                _context(row, tokens[0], n if n is not None else tokens[1])
            else:
                row.prompt_tokens = row.context_length = tokens[0]
                row.derived += [("prompt_tokens", "the run's prompt tokens"), ("context_length", "the prompt tokens")]
        rows.append(row.raw())
    return rows
