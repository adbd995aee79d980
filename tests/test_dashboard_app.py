"""The pages as engineers use them (issue #16), in Streamlit's AppTest: what the Builds preview refuses before a
conversion is queued, the form kept across pages, the log of a failed build, the A/B that is not apples to
apples, a comparison restored from the URL, duplicate log uploads, and why a log label is (not) mapped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.convert import jobs
from analyzer.errors import BuildError
from analyzer.report.catalog import shipped_analyses
from tests.test_app import EXAMPLE_LOG, new_app, open_page, texts

REPO = Path(__file__).resolve().parent.parent
PRESETS = REPO / "analyzer" / "model" / "presets"
GPT2 = REPO / "tests" / "data" / "bad_configs" / "gpt2.json"
BUILDS = "app_pages/builds.py"


def upload(name: str, data: bytes) -> dict:
    """The Builds form with a config.json uploaded earlier in the session (AppTest cannot drive the uploader)."""
    return {"builds_source_kind": "Upload config.json", "builds_upload_kept": (name, data)}


# ---------------------------------------------------------------------------------------------- Builds preview
def test_an_unsupported_family_is_refused_in_the_preview_naming_the_supported_ones(tiny_builds):
    at = open_page(BUILDS, **upload("gpt2-config.json", GPT2.read_bytes()))
    errors = texts(at.error)
    assert any("model_type='gpt2' is not a family qfold converts (supported: exaone4, gemma3_text, llama" in e
               for e in errors), errors
    assert at.button(key="builds_convert").disabled  # refused before anything is queued


def test_the_cost_check_runs_in_the_preview(tiny_builds, monkeypatch):
    at = open_page(BUILDS)
    assert any("of memory for 2 analysis builds" in c and "of a limit of" in c and "within ±" in c
               for c in texts(at.caption)), texts(at.caption)  # the request (an A/B, one child), its stated error
    assert not at.button(key="builds_convert").disabled
    cost = next(c for c in texts(at.caption) if "of a limit of" in c)
    peak_gb = float(cost.split("(peak ")[1].split(" GB")[0])
    monkeypatch.setenv("QFOLD_MAX_BUILD_BYTES", str(int(peak_gb * 1e9)))  # between the estimate's two ends
    at.number_input(key="builds_ctx").set_value(4000).run()
    assert any("It may not fit" in w for w in texts(at.warning)) and not at.button(key="builds_convert").disabled
    monkeypatch.setenv("QFOLD_MAX_BUILD_BYTES", "100000000")  # 0.1 GB: nothing fits
    at.number_input(key="builds_ctx").set_value(2048).run()
    errors = texts(at.error)
    assert any("this conversion does not fit: estimated peak memory" in e and "the limit is 0.1 GB" in e
               for e in errors), errors
    assert at.button(key="builds_convert").disabled
    monkeypatch.delenv("QFOLD_MAX_BUILD_BYTES")
    at.number_input(key="builds_ctx").set_value(131_072).run()  # past EXAONE's max_position_embeddings
    errors = texts(at.error)
    assert any("max_position_embeddings=65,536" in e and "choose a context length within it" in e for e in errors)
    assert not any("--" in e for e in errors) and at.button(key="builds_convert").disabled


def test_an_uploaded_config_is_named_by_its_file_and_model_type(tiny_builds):
    at = open_page(BUILDS, **upload("config.json", (PRESETS / "llama-3.2-1b.json").read_bytes()))
    assert any(m.startswith("llama (llama)") for m in texts(at.markdown)), texts(at.markdown)
    at = open_page(BUILDS, **upload("Team Llama v2.json", (PRESETS / "llama-3.2-1b.json").read_bytes()))
    assert any(m.startswith("Team-Llama-v2 (llama)") for m in texts(at.markdown)), texts(at.markdown)
    assert any("Using Team Llama v2.json, uploaded earlier" in c for c in texts(at.caption))


def test_the_builds_form_keeps_its_values_across_pages(tiny_builds):
    at = open_page(BUILDS)
    at.number_input(key="builds_ctx").set_value(2048).run()
    at.selectbox(key="builds_preset").set_value("qwen3-0.6b").run()
    at.multiselect(key="builds_variants").set_value(["qfold"]).run()
    at.switch_page("app_pages/ab.py")
    at.run()
    at.switch_page(BUILDS)
    at.run()
    assert at.number_input(key="builds_ctx").value == 2048
    assert at.selectbox(key="builds_preset").value == "qwen3-0.6b"
    assert at.multiselect(key="builds_variants").value == ["qfold"]


def test_a_failed_build_opens_its_log(tiny_builds, monkeypatch):
    def failing(specs, root=None, on_progress=None, timeout_s=None, force_ctx=False):
        on_progress(jobs.Progress(0.2, "convert", "tracing"))
        raise BuildError(f"build {specs[0].key} failed: out of memory (log: x.log)")

    monkeypatch.setattr(jobs, "run_builds", failing)
    at = open_page(BUILDS, builds_ctx=64, builds_layers=1, builds_variants=["qfold"])
    at.button(key="builds_convert").click().run()
    (job,) = at.session_state["builds_jobs"]
    job._thread.join(timeout=30)
    at.run()
    assert at.toggle(key=f"builds_log_{job.id}").value is True
    assert any("out of memory" in e for e in texts(at.error))
    at.toggle(key=f"builds_log_{job.id}").set_value(False).run()  # closed by the user: it stays closed
    assert at.toggle(key=f"builds_log_{job.id}").value is False


# ---------------------------------------------------------------------------------------------- A/B
def test_an_ab_of_different_builds_names_the_differences_and_offers_the_matching_pair(tiny_builds):
    assert {"repeat_kv", "qfold"} <= set(shipped_analyses())
    tiny = f"build:{tiny_builds['qfold'].name}"
    at = open_page(ab_a="shipped:exaone-4.0-1.2b-repeat_kv-state-ctx4096", ab_b=tiny)
    warning = next(w for w in texts(at.warning) if w.startswith("A and B differ in"))
    assert "size (full size vs 2 layers, structure)" in warning and "ctx (4096 vs 256)" in warning
    assert "geometry (30 layers, 32/8 heads, head_dim 64 vs 2 layers, 32/8 heads, head_dim 64)" in warning
    assert any("structure build" in c for c in texts(at.caption))  # predicted tok/s carry the caveat
    at.button(key="ab_match_B").click().run()  # B's matching pair: the tiny repeat_kv and qfold
    assert (at.session_state["ab_a"], at.session_state["ab_b"]) == (f"build:{tiny_builds['repeat_kv'].name}", tiny)
    assert not any(w.startswith("A and B differ in") for w in texts(at.warning))


def test_the_url_carries_the_comparison(tiny_builds, tmp_path, monkeypatch):
    a, b = (f"build:{tiny_builds[v].name}" for v in ("repeat_kv", "qfold"))
    monkeypatch.setenv("QFOLD_DATA_ROOTS", str(tmp_path))
    at = new_app(120)
    at.query_params.update({"a": a, "b": b, "bw": "profile:m1-ane", "pkg": "/etc/passwd.mlpackage"})
    at.run()
    assert not at.exception
    assert (at.selectbox(key="ab_a__widget").value, at.selectbox(key="ab_b__widget").value) == (a, b)
    assert any(m.label.startswith("predicted tok/s at 60,870 MB/s") for m in at.metric)
    assert any("outside the folders this server may read" in w for w in texts(at.warning))  # said, not followed
    assert "pkg" not in at.query_params
    at.selectbox(key="ab_b__widget").set_value(a).run()  # a new choice is written back for the next reload
    assert at.query_params["b"] in (a, [a])


# ---------------------------------------------------------------------------------------------- logs
def test_the_same_log_uploaded_twice_counts_once(tiny_builds):
    data = EXAMPLE_LOG.read_bytes()
    at = open_page("app_pages/device_logs.py", logs_files=[("phone.csv", data), ("phone (1).csv", data)],
                   logs_example=False)
    infos = texts(at.info)
    assert any("phone (1).csv is the same file as phone.csv" in i for i in infos), infos
    assert any(c.startswith("6 decode, 0 prefill and 0 mixed run(s)") for c in texts(at.caption))  # not 12


def test_every_log_label_says_why_it_is_or_is_not_mapped(tiny_builds):
    at = open_page("app_pages/device_logs.py")
    captions = texts(at.caption)
    assert any(c.startswith("Mapped by its label: names exaone-4.0-1.2b · qfold · top8") for c in captions), captions
    assert any(c.startswith("Not mapped: names no variant") for c in captions)
    mapping = at.session_state["logs_mapping"]
    assert mapping["exaone-top8-device-table"] is None  # never filled in from "the default pair"


@pytest.mark.parametrize("page", ["app_pages/ab.py", "app_pages/bandwidth.py", "app_pages/export.py"])
def test_tables_never_show_minus_zero(tiny_builds, page):
    at = open_page(page)
    for frame in (d.value for d in at.dataframe):
        text = json.dumps(frame.astype(str).to_dict("records")) if hasattr(frame, "astype") else ""
        assert "-0.0\"" not in text


def test_a_link_to_an_analysis_this_server_lacks_says_so(tiny_builds):
    at = new_app(120)
    at.query_params.update({"a": "build:made-elsewhere-0123456789", "bw": "typed:nonsense"})
    at.run()
    warnings = texts(at.warning)
    assert any("its A (build:made-elsewhere-0123456789) is not among the analyses on this server" in w
               for w in warnings), warnings
    assert any("bandwidth 'nonsense' MB/s" in w for w in warnings)
    assert at.selectbox(key="ab_a__widget").value != "build:made-elsewhere-0123456789"  # the default instead
