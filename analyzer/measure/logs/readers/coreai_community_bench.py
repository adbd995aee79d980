"""The community Core AI benchmark blob (``"kind" : "coreai-community-bench"``, ``schema_version`` 1), posted as
``bench-result`` issues on john-rocky/coreai-model-zoo (e.g. #3, #24-#34, read 2026-12-05) and aggregated by its
``scripts/aggregate_bench.py``. The app builds it with ``JSONEncoder`` ``[.sortedKeys, .prettyPrinted]``
from the ``BenchBlob`` ``Codable`` types of two protocols:

- ``zoo-chat-v1`` (the CoreAI Zoo app 2.0+, john-rocky/coreai-zoo-app ``Sources/Bench/BenchRunner.swift`` @
  e517bf72393f): a fixed text prompt, 256 greedy tokens, 1 cold + 3 warm runs; per run ``prompt_tokens``,
  ``ttft_s``, ``prefill_tok_s`` = prompt tokens ÷ TTFT, ``decode_tok_s`` = the kit's 32-token rolling-window rate,
  ``gen_tokens``, ``thermal_state_end``; rates rounded to 0.1, TTFT to 0.01 s.
- ``pb-random-v1`` (the July 2026 CoreAIChat TestFlight build, john-rocky/coreai-model-zoo
  ``apps/CoreAIChat/Sources/BenchRunner.swift`` @ 3bb8eb17be60): a 128-token random prompt
  (``protocol.prompt_tokens``), 256 greedy tokens; per run ``prefill_s``, ``decode_s``, ``prefill_tok_s`` = 128 ÷
  ``prefill_s``, ``decode_tok_s`` = (``gen_tokens`` − 1) ÷ ``decode_s``; the device's ``os_build``; ``timestamps``.

Each warm run gives a prefill row and a decode row. The device is ``device.model_identifier`` (``iPhone18,1``,
``Mac16,7``), the OS ``device.os`` with ``os_build``, the build ``model.hf_repo`` / ``model.bundle`` (else
``model.id``). ``context_length`` is derived: the prompt for prefill, prompt + ``gen_tokens`` for decode. Cold runs
(first run after loading, "cold GPU specialization may land here") are skipped with a warning, as the aggregator
takes its medians over warm runs only; a blob the aggregator would exclude (Low Power Mode on, a serious or critical
thermal state before the run) is read with a warning. ``results.load_s`` is kept, not used ("in the zoo app it wraps
the catalog download too", aggregate_bench.py).
"""

from __future__ import annotations

import json

from analyzer.measure.logs.readers.json_doc import LinedDict, document_text, json_text, loads_with_lines, number_text
from analyzer.measure.logs.records import LogLimits
from analyzer.measure.logs.rows import Collector, RawRow, RejectError, mapped

FORMAT = "coreai-community-bench"
KIND = "coreai-community-bench"
SCHEMA_VERSION = 1
PROTOCOLS = ("zoo-chat-v1", "pb-random-v1")
HOT = ("serious", "critical")


def detect(text: str) -> bool:
    found = document_text(text)
    return found is not None and (f'"{KIND}"' in found[0] or ('"decode_tok_s"' in found[0]
                                                              and '"runs"' in found[0]))


def _obj(doc: LinedDict, key: str) -> LinedDict:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise RejectError(f"{key} must be an object in a {KIND} blob", line=doc.line, column=key)
    return value  # type: ignore[return-value]


def _text(obj: dict, key: str) -> str | None:
    value = obj.get(key)
    return value.strip() or None if isinstance(value, str) else None


def read_text(text: str, limits: LogLimits, col: Collector) -> list[RawRow]:
    found = document_text(text)
    if found is None:
        raise RejectError(f"not a JSON object: a {KIND} blob is one")
    doc = loads_with_lines(found[0], found[1], text)
    if not isinstance(doc, dict):
        raise RejectError(f"expected the blob's JSON object, got a JSON {type(doc).__name__}")
    if doc.get("kind") != KIND:
        raise RejectError(f"kind {json.dumps(doc.get('kind'))}: expected {KIND!r}", line=doc.line, column="kind")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise RejectError(f"schema_version {json.dumps(doc.get('schema_version'))}: this reader knows schema "
                          f"{SCHEMA_VERSION} (BenchRunner.swift)", line=doc.line, column="schema_version")
    device, model, protocol, results = (_obj(doc, k) for k in ("device", "model", "protocol", "results"))
    runs = results.get("runs")
    if not isinstance(runs, list) or not runs:
        raise RejectError("results.runs must be a non-empty list of runs", line=results.line, column="runs")
    if 2 * len(runs) > limits.max_rows:
        raise RejectError(f"more than {limits.max_rows:,} rows (limit); split the file", column="runs")
    name = _text(protocol, "name")
    if name not in PROTOCOLS:
        col.add(protocol.line, "protocol.name", json_text(protocol.get("name")), "warning",
                f"a protocol this reader does not know (it knows {', '.join(PROTOCOLS)}): runs are read by the "
                "schema's field names")
    env = doc.get("environment") if isinstance(doc.get("environment"), dict) else {}
    excluded = [why for why, bad in (("Low Power Mode on", env.get("low_power_mode") is True),
                                     (f"thermal state {env.get('thermal_state_before')!r} before the run",
                                      env.get("thermal_state_before") in HOT)) if bad]
    if excluded:
        col.add(getattr(env, "line", None), "environment", None, "warning",
                f"{'; '.join(excluded)}: the zoo's aggregator leaves such a blob out of its medians; its runs are "
                "read and say so in their notes")
    labels = _labels(device, model, doc)
    shared = [(f"{where}.{k}", json_text(obj[k])) for where, obj in (("results", results), ("device", device),
                                                                      ("model", model))
              for k in ("load_s", "memory_gb", "engine_hint", "bundle_kind", "hf_revision") if k in obj]
    shared.append(("protocol", name or json_text(protocol.get("name"))))
    protocol_prompt = protocol.get("prompt_tokens")
    rows: list[RawRow] = []
    for k, run in enumerate(runs, start=1):
        line = run.line if isinstance(run, LinedDict) else results.line
        if isinstance(run, dict) and run.get("kind") == "cold":
            col.next_record(), col.next_record()  # its prefill and decode rows, counted as skipped
            col.n_skipped += 2
            col.add(line, "kind", "cold", "warning", f"run {k} is a cold run (the first after loading, which may "
                    "include specialization): skipped, as the aggregator's medians use warm runs only")
            continue
        for phase, key in (("prefill", "prefill_tok_s"), ("decode", "decode_tok_s")):
            record = col.next_record()
            if not isinstance(run, dict):
                col.add(line, "runs", json_text(run), "error", f"run {k} is not an object", record=record,
                        shared_line=True)
                continue
            tps = number_text(run.get(key))
            if tps is None:
                col.add(line, key, json_text(run[key]) if key in run else None, "error",
                        f"run {k}: {key} must be a JSON number (tokens per second)", record=record, shared_line=True)
                continue
            prompt = run.get("prompt_tokens", protocol_prompt)
            counts = _counts(col, line, record, k, phase, prompt, run.get("gen_tokens"))
            if counts is None:
                continue
            cells = {**labels, "tok_per_s": (tps, key), "phase": (phase, "runs[]"),
                     "prompt_tokens": (str(counts[0]), "prompt_tokens"),
                     "context_length": (str(counts[1]), "prompt_tokens" if phase == "prefill"
                                        else "prompt_tokens + gen_tokens"),
                     "notes": (f"{KIND} {name or '?'} run {k} ({run.get('kind', '?')}), {phase}"
                               + (f"; {'; '.join(excluded)}" if excluded else ""), "notes (generated)")}
            values, source = mapped(cells)
            extra = [("run", str(k)), *shared] + [(f"run.{x}", json_text(run[x])) for x in
                                                  ("kind", "ttft_s", "prefill_s", "decode_s", "thermal_state_end")
                                                  if x in run]
            how = ("the run's prompt tokens" if phase == "prefill"
                   else "prompt tokens + gen_tokens: the KV positions the last generated token attends over")
            rows.append(RawRow(line, record, values, source, tuple(extra),
                               (("phase", f"{key} of a {KIND} run"), ("context_length", how),
                                ("prompt_tokens", "runs[].prompt_tokens, else protocol.prompt_tokens")),
                               shared_line=True))
    return rows


def _labels(device: LinedDict, model: LinedDict, doc: LinedDict) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    if identifier := _text(device, "model_identifier"):
        out["device"] = (identifier, "device.model_identifier")
    os = _text(device, "os")
    if os:
        build = _text(device, "os_build")
        out["os_version"] = (f"{os} ({build})" if build else os, "device.os" + (", os_build" if build else ""))
    repo, bundle, ident = _text(model, "hf_repo"), _text(model, "bundle"), _text(model, "id")
    if repo and bundle:
        out["build"] = (f"{repo}/{bundle}", "model.hf_repo/model.bundle")
    elif repo or ident:
        out["build"] = (repo or ident or "", "model.hf_repo" if repo else "model.id")
    timestamps = doc.get("timestamps")
    if isinstance(timestamps, dict) and _text(timestamps, "started"):
        out["date"] = (_text(timestamps, "started") or "", "timestamps.started")
    return out


def _counts(col: Collector, line: int, record: int, k: int, phase: str, prompt: object,
            gen: object) -> tuple[int, int] | None:
    """(prompt tokens, context length) of a run's row, or None with the row refused (reported)."""
    for what, value in (("prompt_tokens", prompt), ("gen_tokens", gen)):
        if what == "gen_tokens" and phase == "prefill":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            col.add(line, what, json_text(value), "error", f"run {k}: {what} must be a whole number of tokens "
                    "(runs[].prompt_tokens, else protocol.prompt_tokens)" if what == "prompt_tokens" else
                    f"run {k}: {what} must be a whole number of tokens", record=record, shared_line=True)
            return None
    assert isinstance(prompt, int)
    return prompt, prompt if phase == "prefill" else prompt + int(gen)  # type: ignore[call-overload]
