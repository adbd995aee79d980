"""Device benchmark logs → validated ``Measurement`` records, with every rejected row explained.

Why strict: a throughput log is the only ground truth the bandwidth model is checked against, and a CSV that
is silently shifted by one column (or a "31,2" read as 31) turns a wrong number into a confident conclusion.
So every file, whatever its format, goes through the same gates in this order:

1. bytes → text (``text``): size limit, strict UTF-8, no NUL or control characters (terminal colour codes are
   removed with a warning);
2. format detection by content (``detect``, the ``FORMATS`` registry): runner summary lines (llama.cpp,
   mlx_lm, ExecuTorch, ExecuTorch Core ML static, ANEMLL), llama-bench JSON / JSONL / SQL / markdown / CSV,
   qfold's markdown or CSV schema;
3. structure (``readers/``, one reader per format): limits, the field count of every record against its
   header, per-record errors (a ragged row, a bad JSONL line, a bad object in a minified JSON array, a corrupt
   runner line) that reject that record only, never its neighbours;
4. cell syntax (``cells``: a plain decimal, no decimal commas or units) and 5. typed checks (``validate``,
   a pandera schema: finite, inside ``TOK_PER_S_RANGE``, counts up to ``TOKEN_COUNT_MAX``, a known phase,
   non-empty labels). Labels are NFKC-normalised with invisible characters removed, so ``b1`` and
   ``b1\\u200b`` are one build; formula-like text is kept verbatim and flagged.

Policy: a file-level problem rejects the whole file; a bad record rejects that record only and is listed with
its line, column, value and reason. Line numbers are 1-based lines of the file; a record whose quoted field
spans several lines is reported at the line it starts on. Fields computed rather than read (a phase from a
llama-bench test, a context length from n_depth + n_gen) are listed in ``Measurement.derived``.

``summarize`` averages repeated runs as seconds per token (the harmonic mean of tok/s) and never across
conditions (context length, compute units, quantization, OS, phase).
"""

from __future__ import annotations

from analyzer.measure.logs.cells import parse_decimal
from analyzer.measure.logs.detect import FORMATS, LogFormatSpec
from analyzer.measure.logs.importer import parse_log, parse_logs
from analyzer.measure.logs.log_summary import GROUP_FIELDS, BuildDeviceSummary, summarize
from analyzer.measure.logs.readers.llama_bench import BUILD_FIELDS as LLAMA_BENCH_BUILD_FIELDS
from analyzer.measure.logs.readers.llama_bench import DEVICE_FIELDS as LLAMA_BENCH_DEVICE_FIELDS
from analyzer.measure.logs.readers.llama_bench import REQUIRED_FIELDS as LLAMA_BENCH_REQUIRED
from analyzer.measure.logs.records import (
    KNOWN_COLUMNS,
    OPTIONAL_COLUMNS,
    PHASES,
    REQUIRED_COLUMNS,
    TEXT_COLUMNS,
    TOK_PER_S_RANGE,
    TOKEN_COUNT_MAX,
    VALUE_PREVIEW_CHARS,
    FileReport,
    LogImport,
    LogIssue,
    LogLimits,
    LogValidationError,
    Measurement,
    Phase,
    Severity,
)
from analyzer.measure.logs.text import check_size, normalize_label
from analyzer.measure.logs.validate import MEASUREMENT_SCHEMA

LogFormat = str
"""A format name: a key of ``FORMATS`` (``llama-bench-md``, ``qfold-csv``, …)."""

__all__ = [
    "FORMATS",
    "GROUP_FIELDS",
    "KNOWN_COLUMNS",
    "LLAMA_BENCH_BUILD_FIELDS",
    "LLAMA_BENCH_DEVICE_FIELDS",
    "LLAMA_BENCH_REQUIRED",
    "MEASUREMENT_SCHEMA",
    "OPTIONAL_COLUMNS",
    "PHASES",
    "REQUIRED_COLUMNS",
    "TEXT_COLUMNS",
    "TOKEN_COUNT_MAX",
    "TOK_PER_S_RANGE",
    "VALUE_PREVIEW_CHARS",
    "BuildDeviceSummary",
    "FileReport",
    "LogFormat",
    "LogFormatSpec",
    "LogImport",
    "LogIssue",
    "LogLimits",
    "LogValidationError",
    "Measurement",
    "Phase",
    "Severity",
    "check_size",
    "normalize_label",
    "parse_decimal",
    "parse_log",
    "parse_logs",
    "summarize",
]
