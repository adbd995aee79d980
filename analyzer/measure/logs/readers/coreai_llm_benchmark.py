"""Apple's Core AI LLM benchmark, ``llm-benchmark --output-json FILE`` (apple/coreai-models
``swift/Sources/Tools/benchmark/BenchmarkMain.swift`` @ 8668e570f16d, "Based on mlx-lm benchmark"; read 2026-12-05).

Its ``Codable`` report, written by ``JSONEncoder`` with ``.convertToSnakeCase`` keys and ``[.prettyPrinted,
.sortedKeys]``::

    {
      "averages" : { "generation_tps" : …, "prompt_tps" : … },
      "cache_hit" : false,             # PreparedModel.isCached before loading      (since #189, 2026-08-20)
      "generation_tokens" : 1024,      # -g, the InferenceOptions maxTokens
      "model" : "…",                   # the bundle's name
      "num_trials" : 5,
      "prepare_seconds" : …,           # EngineFactory.createEngine                 (since #189)
      "prompt_tokens" : 512,           # -p, a seeded random prompt of that many token ids
      "trials" : [ { "gen_tps" : …, "prompt_tps" : … }, … ],
      "warmup_seconds" : …             # one untimed trial                           (since #189)
    }

Per trial (``runTrial``): ``prompt_tps`` = prompt tokens ÷ the time to the first generated token (a prefill run);
``gen_tps`` = (generated tokens − 1) ÷ the time from the first token to the last (a decode run). Each trial gives
those two rows. ``context_length`` is derived: the prompt for the prefill row; prompt + ``generation_tokens`` for the
decode row, the KV positions its last token attends over when generation runs to ``maxTokens`` (the report keeps no
count of tokens generated, so an early end of sequence would make it smaller). The report names no device: labels,
else the file name, stand in. ``averages`` are arithmetic means of the trials' rates (kept beside each row, not
used: qfold averages runs as seconds per token).
"""

from __future__ import annotations

from analyzer.measure.logs.readers.json_doc import LinedDict, document_text, json_text, loads_with_lines, number_text
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError, mapped

FORMAT = "coreai-llm-benchmark"
REQUIRED = ("prompt_tokens", "generation_tokens", "trials")
TOOL = "coreai-models llm-benchmark"


def detect(text: str) -> bool:
    """A JSON object (or one fenced) naming the report's own keys; judged on the text, so a report with a syntax
    error is still read by this reader, which says where the error is."""
    found = document_text(text)
    return found is not None and '"trials"' in found[0] and ('"gen_tps"' in found[0] or '"generation_tokens"'
                                                             in found[0])


def read_text(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    found = document_text(text)
    if found is None:
        raise RejectError("not a JSON object: llm-benchmark --output-json writes one")
    doc = loads_with_lines(found[0], found[1], text)
    if not isinstance(doc, dict):
        raise RejectError(f"expected the report's JSON object, got a JSON {type(doc).__name__}")
    if not isinstance(doc.get("trials"), list):
        raise RejectError("trials must be a list of {gen_tps, prompt_tps}", line=doc.line, column="trials")
    return read(doc, limits, col)


def _count(doc: dict, key: str) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RejectError(f"{key} must be a whole number of tokens >= 1 (the benchmark's -p/-g), got "
                          f"{json_text(value)}", line=getattr(doc, "line", None), column=key)
    return value


def read(doc: LinedDict, limits: LogLimits, col: Collector) -> list[RawRow]:
    missing = [k for k in REQUIRED if k not in doc]
    if missing:
        raise RejectError(f"an llm-benchmark report without {', '.join(missing)}", column=", ".join(missing))
    prompt, generation = _count(doc, "prompt_tokens"), _count(doc, "generation_tokens")
    trials = doc["trials"]
    if not trials:
        raise RejectError("an llm-benchmark report with no trials", column="trials")
    if 2 * len(trials) > limits.max_rows:
        raise RejectError(f"more than {limits.max_rows:,} rows (limit); split the file", column="trials")
    n_trials = doc.get("num_trials")
    if n_trials != len(trials):
        col.add(doc.line, "num_trials", json_text(n_trials), "warning",
                f"num_trials says {json_text(n_trials)} but the report holds {len(trials)} trial(s): each is read")
    model = doc.get("model")
    shared = _shared(doc)
    rows: list[RawRow] = []
    for k, trial in enumerate(trials, start=1):
        line = trial.line if isinstance(trial, LinedDict) else doc.line
        for phase, key, average in (("prefill", "prompt_tps", "prompt_tps"),
                                    ("decode", "gen_tps", "generation_tps")):
            record = col.next_record()
            if not isinstance(trial, dict):
                col.add(line, "trials", json_text(trial), "error", f"trial {k} is not an object of gen_tps and "
                        "prompt_tps", record=record, shared_line=True)
                continue
            tps = number_text(trial.get(key))
            if tps is None:
                col.add(line, key, json_text(trial.get(key)) if key in trial else None, "error",
                        f"trial {k}: {key} must be a JSON number (tokens per second)", record=record,
                        shared_line=True)
                continue
            context = prompt if phase == "prefill" else prompt + generation
            cells = {"tok_per_s": (tps, key), "phase": (phase, "trials[]"),
                     "prompt_tokens": (str(prompt), "prompt_tokens"),
                     "context_length": (str(context), "prompt_tokens" if phase == "prefill"
                                        else "prompt_tokens + generation_tokens"),
                     "notes": (f"{TOOL} trial {k} of {len(trials)}, {phase}", "notes (generated)")}
            if isinstance(model, str):
                cells["build"] = (model, "model")
            values, source = mapped(cells)
            averages = doc.get("averages") if isinstance(doc.get("averages"), dict) else {}
            extra = [("trial", str(k)), *shared]
            if number_text(averages.get(average)) is not None:
                extra.append(("reported_average_tok_per_s", number_text(averages[average]) or ""))
            how = ("prompt_tokens: the KV positions the last prompt token attends over" if phase == "prefill" else
                   "prompt_tokens + generation_tokens: the KV positions the last generated token attends over when "
                   "generation runs to maxTokens (the report keeps no count of the tokens generated)")
            rows.append(RawRow(line, record, values, source, tuple(extra),
                               (("phase", f"{key} of an llm-benchmark trial"), ("context_length", how),
                                ("prompt_tokens", "prompt_tokens of the report")), shared_line=True))
    return rows


def _shared(doc: dict) -> list[tuple[str, str]]:
    """The report's own fields every row carries (time to prepare the asset, cache hit, warm-up)."""
    out = []
    for key in ("prepare_seconds", "cache_hit", "warmup_seconds", "num_trials", "generation_tokens"):
        if key in doc:
            out.append((key, json_text(doc[key])))
    return out
