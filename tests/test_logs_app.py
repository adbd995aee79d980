"""The Device logs page's paste box and label fields, through Streamlit's AppTest (no browser).

A paste is read exactly as an upload: same detection, same per-row errors, and nothing written to disk.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.test_app import new_app, open_page, plain, texts

REPO = Path(__file__).resolve().parent.parent
README_TABLE = (REPO / "examples" / "llama_bench_readme.md").read_text(encoding="utf-8")
PAGE = "app_pages/device_logs.py"


def accepted_frame(at, file: str | None = "pasted text 1"):
    """The accepted runs (of ``file``: a paste adds to the example log, which stays shown)."""
    frame = next(d.value for d in at.dataframe if "tok_per_s" in d.value.columns and "line" in d.value.columns)
    return frame if file is None else frame[frame["file_name"] == file]


def paste(at, text: str):
    at.text_area(key="logs_paste_text").input(text).run()
    at.button(key="logs_paste_add").click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_pasting_the_readme_table_gives_its_tg_rate_as_a_decode_run(tiny_builds, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # anything written to disk would land here
    at = paste(open_page(PAGE), README_TABLE)
    assert at.session_state["logs_files"] == [("pasted text 1", README_TABLE.encode())]
    frame = accepted_frame(at)
    decode = frame[frame["phase"] == "decode"]
    assert list(decode["tok_per_s"]) == [197.71] and list(decode["context_length"]) == [128]
    assert list(frame[frame["phase"] == "prefill"]["tok_per_s"]) == [5765.41]
    files = next(d.value for d in at.dataframe if "format" in d.value.columns).set_index("file")
    assert files.loc["pasted text 1", "format"] == "llama-bench-md"
    assert "phase: from the llama-bench test" in files.loc["pasted text 1", "derived fields"]
    assert not at.error
    assert list(tmp_path.iterdir()) == []


def test_a_paste_is_refused_per_row_like_an_upload(tiny_builds):
    broken = README_TABLE.replace("197.71 ± 0.81", "197,71 ± 0.81")
    at = paste(open_page(PAGE), broken)
    issues = next(d.value for d in at.dataframe if "reason" in d.value.columns)
    errors = issues[issues["severity"] == "error"]
    where = list(zip(errors["file"], errors["row (line)"], errors["column"], strict=True))
    assert where == [("pasted text 1", 4, "t/s")]
    assert list(accepted_frame(at)["phase"]) == ["prefill"]  # the other row stays


def test_the_label_fields_name_the_device_and_build_of_runner_output(tiny_builds):
    runner = (REPO / "tests" / "data" / "logs" / "mlx_lm_generate.txt").read_text(encoding="utf-8")
    at = paste(open_page(PAGE), runner)
    at.text_input(key="logs_device_input").input("MacBook Pro M3 Max").run()
    at.text_input(key="logs_label_input").input("qwen2.5-0.5b-4bit\u200b").run()
    frame = accepted_frame(at)
    assert set(frame["device"]) == {"MacBook Pro M3 Max"} and set(frame["build"]) == {"qwen2.5-0.5b-4bit"}
    assert not any("stands in" in w for w in texts(at.warning))
    labels = [plain(s.label) for s in at.selectbox]
    assert "qwen2.5-0.5b-4bit" in labels  # the label can be mapped to an analysis


def test_a_pasted_placement_plan_goes_to_the_ab_page_not_the_log_importer(tiny_builds):
    report = (REPO / "tests" / "data" / "placement" / "anemll_profile_report.txt").read_text(encoding="utf-8")
    at = paste(open_page(PAGE), report)
    assert at.session_state["logs_plans"] == [("pasted text 1", report.encode())]
    assert not at.session_state["logs_files"]  # the example log stays on
    plans = next(d.value for d in at.dataframe if "ops" in d.value.columns and "functions" in d.value.columns)
    assert plans.to_dict("records") == [{"file": "pasted text 1", "format": "anemll-profile", "accepted": True,
                                         "ops": 24, "functions": "", "errors": 0, "warnings": 0}]


def test_both_pages_show_the_roof_flags_and_the_bandwidth_page_leaves_impossible_rows_out(tiny_builds):
    """Rows of the write-up's top8 Q-fold label (it maps to the shipped analysis by itself) on an M1 Max's GPU: one
    at 5,000 tok/s (no memory system streams ~1 GB that often), one at 1 tok/s (under a tenth of its roof)."""
    log = ("device,build,tok_per_s,context_length,compute_units\n"
           "Apple M1 Max,exaone-qfold-top8,5000,4096,GPU\nApple M1 Max,exaone-qfold-top8,1,4096,GPU\n"
           "Apple M1 Max,exaone-repeat_kv-top8,150,4096,GPU\n")
    at = paste(open_page(PAGE, logs_example=False), log)  # these rows alone
    roofs = next(d.value for d in at.dataframe if "roof_tok_per_s" in d.value.columns)
    assert list(roofs["flags"]) == ["above_roof", "far_below_roof", ""]
    assert set(roofs["roof_profile"]) == {"m1-max-soc"} and set(roofs["roof_bw_bytes_per_s"]) == {400_000_000_000}
    assert any("1 row(s) `above_roof`" in e for e in texts(at.error))
    assert any("1 row(s) `far_below_roof`" in w for w in texts(at.warning))

    at.switch_page("app_pages/bandwidth.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("1 above their roof, left out of the fits" in w for w in texts(at.warning))
    crosscheck = next(d.value for d in at.dataframe if "measured tok/s" in d.value.columns)
    qfold = crosscheck[crosscheck["build"] == "exaone-qfold-top8"]
    assert list(qfold["n"]) == [1] and list(qfold["measured tok/s"]) == [1.0]  # the 5,000 tok/s row left out
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    roof = next(t for t in chart["data"] if t["name"].startswith("roof Apple M1 Max"))
    assert "m1-max-soc" in roof["name"] and roof["line"]["dash"] == "dot"
    assert roof["y"][0] == pytest.approx(400e9 / (roof["x"][0] * 1e6))  # tok/s = BW ÷ bytes along the line
    at.toggle(key="bw_keep_impossible").set_value(True).run()
    crosscheck = next(d.value for d in at.dataframe if "measured tok/s" in d.value.columns)
    assert list(crosscheck[crosscheck["build"] == "exaone-qfold-top8"]["n"]) == [2]


def test_a_paste_adds_to_the_example_which_is_removed_and_shown_again_by_its_own_buttons(tiny_builds):
    at = paste(open_page(PAGE), README_TABLE)
    files = set(accepted_frame(at, None)["file_name"])
    assert files == {"writeup_device_logs.csv", "pasted text 1"}  # added to, not replaced
    assert any("beside your 1 log(s)" in i for i in texts(at.info))
    at.button(key="logs_example_remove").click().run()
    assert set(accepted_frame(at, None)["file_name"]) == {"pasted text 1"}
    at.button(key="logs_example_add").click().run()
    assert set(accepted_frame(at, None)["file_name"]) == {"writeup_device_logs.csv", "pasted text 1"}
    at.button(key="logs_reset").click().run()  # my logs go, the example stays
    assert set(accepted_frame(at, None)["file_name"]) == {"writeup_device_logs.csv"}


def test_a_new_session_with_the_links_token_gets_the_logs_back(tiny_builds):
    """A reload is a new Streamlit session: the URL's ``logs`` token brings back the pastes, the removed example and
    the mapping chosen, from the server's store (never from the pasted text's name)."""
    at = paste(open_page(PAGE), README_TABLE)
    at.button(key="logs_example_remove").click().run()
    token = at.query_params["logs"]
    token = token[0] if isinstance(token, list) else token
    assert len(token) == 32
    again = new_app()  # a fresh session, as after a reload, on the URL the first one left
    again.query_params["logs"] = token
    again.switch_page(PAGE)
    again.run()
    assert set(accepted_frame(again, None)["file_name"]) == {"pasted text 1"}
    assert again.session_state["logs_example"] is False
    stale = new_app()
    stale.query_params["logs"] = "0" * 32
    stale.run()
    assert any("no longer kept on this server" in w for w in texts(stale.warning))


def test_an_unmapped_label_of_a_known_model_maps_in_one_click(tiny_builds):
    log = "| model | size | params | backend | ngl | test | t/s |\n| --- | --- | --- | --- | --- | --- | --- |\n" \
          "| exaone4 1.2B Q4_K - Medium | 730.17 MiB | 1.28 B | Metal | 99 | tg128 | 61.20 ± 0.11 |\n"
    at = paste(open_page(PAGE), log)
    label = "exaone4 1.2B Q4_K - Medium"
    assert at.session_state["logs_mapping"][label] is None
    picker = "logs_map_" + hashlib.sha256(label.encode()).hexdigest()[:12]
    offers = [b for b in at.button if str(b.key).startswith(picker) and str(b.label).startswith("Map to ")]
    assert offers and all("exaone" in str(b.label) for b in offers)
    offers[0].click().run()
    chosen = at.session_state["logs_mapping"][label]
    assert chosen and "exaone-4.0-1.2b" in chosen
    assert any(c.startswith("Mapped by you") for c in texts(at.caption))
    assert at.selectbox(key=picker).value == chosen  # the label's picker shows it
