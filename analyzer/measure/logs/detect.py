"""Format detection by content, never by file name: one registry of every format the importer reads.

Order matters and goes from the most to the least specific evidence: runner summary lines (each runner's own
throughput line, anchored at the start of a line), then the Core AI benchmarks' JSON documents (their own keys),
then JSON (``[`` / ``{`` first), llama-bench SQL
(``INSERT INTO``), markdown tables (a ``|---|`` separator row), and CSV last (a header row). A text with the
throughput lines of two different runners is refused rather than guessed at.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from analyzer.measure.logs.readers import (
    anemll,
    coreai_community_bench,
    coreai_llm_benchmark,
    coreml_llm_cli,
    executorch,
    executorch_coreml,
    llama_bench,
    llama_bench_dump,
    llama_cpp,
    markdown,
    mlx_lm,
)
from analyzer.measure.logs.readers.qfold import check_header, qfold_rows
from analyzer.measure.logs.readers.tables import markdown_headers, normalize_header, read_csv_table
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError

Reader = Callable[[str, LogLimits, Collector], list[RawRow]]


@dataclass(frozen=True, slots=True)
class LogFormatSpec:
    """One format: its name (the ``format`` column), what it is, how to recognise a line of it, its reader."""

    name: str
    description: str
    reader: Reader
    runner_detect: Callable[[str], bool] | None = None


def _qfold_csv(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    return qfold_rows(read_csv_table(text, limits, col, header_check=check_header), col)


_SPECS = (
    LogFormatSpec("llama-cpp-timings", "llama.cpp timing lines (llama_perf_context_print / llama_print_timings / "
                  "llama-server: 'eval time = … ms / N runs (… tokens per second)')", llama_cpp.read,
                  llama_cpp.detect),
    LogFormatSpec("mlx-lm-verbose", "mlx_lm.generate --verbose ('Prompt: N tokens, X tokens-per-sec', "
                  "'Generation: …', 'Peak memory: …')", mlx_lm.read, mlx_lm.detect),
    LogFormatSpec("executorch-stats", "ExecuTorch LLM runner report ('PyTorchObserver {…}', 'Generated N tokens: … "
                  "Rate: … (tokens/second)')", executorch.read, executorch.detect),
    LogFormatSpec("executorch-coreml-static", "ExecuTorch Core ML static LLM runner ('Decode: N tokens in Ts "
                  "(X tok/s)')", executorch_coreml.read, executorch_coreml.detect),
    LogFormatSpec("anemll-chat", "ANEMLL chat.py ('Prefill: T ms (X t/s)', 'Inference: X t/s')", anemll.read,
                  anemll.detect),
    LogFormatSpec("coreml-llm-cli", "coreml-llm-cli's summary ('Generate : A +/- S ms / token', 'T +/- S token / "
                  "sec', 'Prompt : X ms')", coreml_llm_cli.read, coreml_llm_cli.detect),
    LogFormatSpec(coreai_community_bench.FORMAT, "the community Core AI benchmark blob (kind "
                  "coreai-community-bench: device model identifier, OS build, warm runs' decode and prefill tok/s, "
                  "TTFT, load time), as posted, fenced or not", coreai_community_bench.read_text),
    LogFormatSpec(coreai_llm_benchmark.FORMAT, "Apple's Core AI llm-benchmark --output-json (per trial prompt and "
                  "generation tok/s, prepare and warm-up times, cache hit)", coreai_llm_benchmark.read_text),
    LogFormatSpec("llama-bench-json", "llama-bench -o json", llama_bench_dump.read_json),
    LogFormatSpec("llama-bench-jsonl", "llama-bench -o jsonl", llama_bench_dump.read_jsonl),
    LogFormatSpec("llama-bench-sql", "llama-bench -o sql (INSERT INTO llama_bench …)", llama_bench_dump.read_sql),
    LogFormatSpec("llama-bench-md", "llama-bench markdown, its default output (| model | … | test | t/s |)",
                  markdown.read),
    LogFormatSpec("qfold-md", "a markdown table in qfold's schema (a tok_per_s column)", markdown.read),
    LogFormatSpec("llama-bench-csv", "llama-bench -o csv", llama_bench.read_csv),
    LogFormatSpec("qfold-csv", "qfold's CSV schema (device, build, tok_per_s, …)", _qfold_csv),
)
FORMATS: Mapping[str, LogFormatSpec] = MappingProxyType({spec.name: spec for spec in _SPECS})
"""Every format the importer reads, by the name the ``format`` column shows."""


def _markdown_kind(headers: list[list[str]]) -> str:
    names = [[name.casefold() for name in header] for header in headers]
    if any(llama_bench.is_llama_bench_markdown(n) for n in names):
        return "llama-bench-md"
    if any("tok_per_s" in n for n in names):
        return "qfold-md"
    return "llama-bench-md"  # its reader names the tables it cannot use


def _csv_kind(text: str) -> str:
    first = next((line for line in text.splitlines() if line.strip()), "")
    try:
        header = next(csv.reader(io.StringIO(first)), [])
        names = normalize_header(header, 1) if header else []
    except (csv.Error, RejectError):
        return "qfold-csv"  # its reader reports what is wrong, at the right line
    return "llama-bench-csv" if llama_bench.is_llama_bench_header(names) else "qfold-csv"


def detect_format(text: str, col: Collector) -> LogFormatSpec:
    """The format of ``text``, from its content alone."""
    runners = [spec for spec in _SPECS if spec.runner_detect is not None and spec.runner_detect(text)]
    if len(runners) > 1:
        raise RejectError("lines of several runners in one file (" + ", ".join(s.name for s in runners) + "): "
                          "split it, one runner per file")
    if runners:
        return runners[0]
    for document in (coreai_community_bench, coreai_llm_benchmark):  # one JSON object holding many runs
        if document.detect(text):
            return FORMATS[document.FORMAT]
    json_kind = llama_bench_dump.detect_json(text)
    if json_kind is not None:
        return FORMATS[json_kind]
    if llama_bench_dump.has_sql_inserts(text):
        return FORMATS["llama-bench-sql"]
    headers = markdown_headers(text)
    if headers:
        return FORMATS[_markdown_kind(headers)]
    return FORMATS[_csv_kind(text)]
