"""The Core AI benchmarks' JSON (tests/data/logs/SOURCES.md): Apple's llm-benchmark report and the community
``coreai-community-bench`` blob of both protocols, each exactly; malformed variants (one value changed here, beside
its verdict) refuse only the rows they touch, with the record's line; documents refused whole say why."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.measure.logs import parse_log

DATA = Path(__file__).resolve().parent / "data" / "logs"


def read(name: str, text: str | None = None, **labels):
    data = (DATA / name).read_bytes() if text is None else text.encode()
    return parse_log(data, name, **labels)


def rows(result) -> list[tuple]:
    return [(m.line, m.phase, m.tok_per_s, m.context_length, m.prompt_tokens) for m in result.measurements]


# ------------------------------------------------------------------------------------------- the fixtures, exactly
def test_apples_llm_benchmark_report_gives_a_prefill_and_a_decode_row_per_trial():
    r = read("coreai_llm_benchmark.json", device="Apple M4 Pro")
    (f,) = r.files
    assert (f.format, f.accepted, f.n_records, f.n_accepted, f.n_rejected, f.n_skipped) == (
        "coreai-llm-benchmark", True, 6, 6, 0, 0)
    assert rows(r) == [(13, "prefill", 608.2231780126553, 512, 512), (13, "decode", 38.90318234170342, 1536, 512),
                       (17, "prefill", 615.9804112358004, 512, 512), (17, "decode", 38.62110437925471, 1536, 512),
                       (21, "prefill", 613.0438717995079, 512, 512), (21, "decode", 38.62474894455422, 1536, 512)]
    first = r.measurements[1]
    assert (first.device, first.build, r.issues) == ("Apple M4 Pro", "qwen3_0_6b_4bit", ())
    extra = dict(first.extra)
    assert (extra["cache_hit"], extra["prepare_seconds"], extra["warmup_seconds"], extra["trial"]) == (
        "true", "0.8412276249999999", "27.93151075", "1")
    assert extra["reported_average_tok_per_s"] == "38.71634522183745"
    assert dict(first.derived)["context_length"].startswith("prompt_tokens + generation_tokens")


def test_a_report_from_before_the_prepare_and_warmup_timings_is_read_too():
    doc = json.loads((DATA / "coreai_llm_benchmark.json").read_text())
    for key in ("prepare_seconds", "cache_hit", "warmup_seconds"):  # apple/coreai-models before #189
        del doc[key]
    r = read("old.json", json.dumps(doc, indent=2))
    assert r.files[0].n_accepted == 6 and "prepare_seconds" not in dict(r.measurements[0].extra)
    assert [i.column for i in r.issues] == ["device"]  # the file name stands in: a warning, once


def test_the_community_blob_as_posted_in_its_fence_skips_the_cold_run_and_reads_the_warm_ones():
    r = read("coreai_community_zoo_chat.md")
    (f,) = r.files
    assert (f.format, f.n_records, f.n_accepted, f.n_rejected, f.n_skipped) == ("coreai-community-bench", 8, 6, 0, 2)
    assert rows(r) == [(48, "prefill", 371.4, 52, 52), (48, "decode", 374.1, 308, 52),
                       (57, "prefill", 368.2, 52, 52), (57, "decode", 373.8, 308, 52),
                       (66, "prefill", 365.9, 52, 52), (66, "decode", 372.9, 308, 52)]
    m = r.measurements[1]
    assert (m.device, m.build, m.os_version) == ("Mac16,7", "mlboydaisuke/qwen3-0.6b-CoreAI-official/macos",
                                                 "Version 27.0 (Build 26A428)")
    assert dict(m.extra)["run.ttft_s"] == "0.14" and dict(m.extra)["results.load_s"] == "0.6"
    (cold,) = r.issues
    assert (cold.severity, cold.line, cold.column) == ("warning", 39, "kind") and "cold run" in cold.message


def test_the_pb_random_protocol_takes_its_prompt_from_the_protocol_and_the_os_build_from_the_device():
    r = read("coreai_community_pb_random.json")
    assert rows(r)[:2] == [(51, "prefill", 70.38, 128, 128), (51, "decode", 68.72, 384, 128)]
    m = r.measurements[1]
    assert (m.device, m.os_version, m.date) == ("iPhone18,1", "iOS 27.0 (24A5355q)", "2026-07-03T05:40:31Z")
    assert dict(m.extra)["run.decode_s"] == "3.710868625" and dict(m.extra)["model.hf_revision"].startswith("34ed")


# --------------------------------------------------------------------------------- malformed: the rows they touch
VARIANTS = [
    # (file, old, new, line, column, fragment, phases lost on that line)
    ("coreai_llm_benchmark.json", '"gen_tps" : 38.62110437925471', '"gen_tps" : "38.6"', 17, "gen_tps",
     "must be a JSON number", {"decode"}),
    ("coreai_llm_benchmark.json", '"prompt_tps" : 613.0438717995079', '"prompt_tps" : -613.04', 21, "prompt_tps",
     "must be > 0", {"prefill"}),
    ("coreai_llm_benchmark.json", '"gen_tps" : 38.90318234170342', '"gen_tps" : 0', 13, "gen_tps", "must be > 0",
     {"decode"}),
    ("coreai_community_zoo_chat.md", '"decode_tok_s" : 373.8', '"decode_tok_s" : null', 57, "decode_tok_s",
     "must be a JSON number", {"decode"}),
    ("coreai_community_zoo_chat.md", '"prefill_tok_s" : 365.9', '"prefill_tok_s" : 4e9', 66, "prefill_tok_s",
     "outside the accepted range", {"prefill"}),
    ("coreai_community_pb_random.json", '"decode_s" : 3.727525,\n        "decode_tok_s" : 68.41,\n        '
     '"gen_tokens" : 256', '"decode_s" : 3.727525,\n        "decode_tok_s" : 68.41,\n        "gen_tokens" : 2.5',
     60, "gen_tokens", "whole number of tokens", {"decode"}),
]


@pytest.mark.parametrize(("name", "old", "new", "line", "column", "fragment", "lost"), VARIANTS,
                         ids=[f"{v[0]}-{v[4]}" for v in VARIANTS])
def test_a_malformed_value_refuses_only_its_row(name, old, new, line, column, fragment, lost):
    text = (DATA / name).read_text(encoding="utf-8")
    assert text.count(old) == 1
    good, bad = read(name, text), read(name, text.replace(old, new))
    assert bad.files[0].accepted and bad.files[0].n_rejected == 1
    (error,) = bad.errors
    assert (error.line, error.column) == (line, column) and fragment in error.message, error.describe()
    assert error.record is not None  # two rows share the run's line: the record says which
    assert rows(bad) == [r for r in rows(good) if not (r[0] == line and r[1] in lost)]


REFUSED = [
    ("coreai_community_zoo_chat.md", '"kind" : "coreai-community-bench"', '"kind" : "bench"',
     'kind "bench"'),  # still detected by its decode_tok_s runs, then refused by kind
    ("coreai_community_pb_random.json", '"schema_version" : 1', '"schema_version" : 2', "schema_version 2"),
    ("coreai_community_pb_random.json", '"runs" : [', '"runs" : 7, "x": [', "results.runs must be"),
    ("coreai_llm_benchmark.json", '"prompt_tokens" : 512', '"prompt_tokens" : 0', "prompt_tokens must be"),
    ("coreai_llm_benchmark.json", '"prompt_tokens" : 512', '"prompt_tokens" : ' + "9" * 5000, "digits"),
    ("coreai_llm_benchmark.json", '"trials" : [', '"trials" : [,', "invalid JSON"),
    ("coreai_llm_benchmark.json", '"cache_hit" : true', '"cache_hit" : NaN', "invalid JSON"),
]


@pytest.mark.parametrize(("name", "old", "new", "fragment"), REFUSED, ids=[f"{v[0]}-{v[3][:12]}" for v in REFUSED])
def test_a_document_that_cannot_be_read_is_refused_whole_with_the_reason(name, old, new, fragment):
    text = (DATA / name).read_text(encoding="utf-8")
    r = read(name, text.replace(old, new, 1))
    (f,) = r.files
    (error,) = r.errors
    assert not f.accepted and fragment in error.message, error.describe()


def test_a_syntax_error_is_reported_at_its_line():
    text = (DATA / "coreai_llm_benchmark.json").read_text().replace('"gen_tps" : 38.62110437925471,',
                                                                  '"gen_tps" : 38.62110437925471,,')
    (error,) = read("x.json", text).errors
    assert error.line == 18 and "invalid JSON" in error.message
