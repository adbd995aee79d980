"""AppTest: the A/B page opens on the A/B the shipped device log measured (the top8 pair, measured 20.39 → 54.30
tok/s beside the predicted figures), the fp16 pair is one click away, and the Graph tab draws a layer."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from analyzer.analysis.record import load_analysis
from analyzer.predict.bandwidth_model import WRITEUP_AB_IPHONE, predicted_tok_per_s
from analyzer.report.catalog import SHIPPED_DIR, shipped_analyses
from tests.test_app import new_app

TOP8 = ("shipped:exaone-4.0-1.2b-repeat_kv-state-ctx4096-top8", "shipped:exaone-4.0-1.2b-qfold-state-ctx4096-top8")
FP16 = ("shipped:exaone-4.0-1.2b-repeat_kv-state-ctx4096", "shipped:exaone-4.0-1.2b-qfold-state-ctx4096")
MEASURED = "measured tok/s (device logs)"

pytestmark = pytest.mark.skipif(not {"repeat_kv", "qfold"} <= set(shipped_analyses()),
                                reason="analyzer/shipped/ lacks the default analyses")


def _open(**state) -> AppTest:
    at = new_app(180)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _predicted(ref_id: str) -> float:
    analysis = load_analysis(SHIPPED_DIR / f"{ref_id.removeprefix('shipped:')}.analysis.json")
    return predicted_tok_per_s(WRITEUP_AB_IPHONE.bytes_per_s, analysis.bytes_per_token.total)


def test_first_screen_is_the_measured_top8_pair_and_fp16_is_one_click_away(builds_root):
    at = _open()
    assert (at.session_state["ab_a"], at.session_state["ab_b"]) == TOP8
    metrics = {m.label: m for m in at.metric}
    assert metrics[MEASURED].value == "20.39 → 54.30"  # examples/writeup_device_logs.csv, the write-up's A/B
    assert metrics[MEASURED].delta == "×2.66 measured"
    predicted = metrics["predicted tok/s at 55,900 MB/s"]
    assert predicted.value == f"{_predicted(TOP8[0]):.1f} → {_predicted(TOP8[1]):.1f}"  # 17.6 → 48.1 (×2.73)
    assert metrics["tile ops, A → B"].value == "60 → 0"

    at.button(key="ab_switch").click().run()
    assert not at.exception
    assert (at.session_state["ab_a"], at.session_state["ab_b"]) == FP16
    metrics = {m.label: m for m in at.metric}
    assert MEASURED not in metrics  # the logs measured no fp16 A/B
    assert metrics["predicted tok/s at 55,900 MB/s"].delta.startswith("×1.70")
    assert at.button(key="ab_switch").label == "Back to the measured pair"
    at.button(key="ab_switch").click().run()
    assert (at.session_state["ab_a"], at.session_state["ab_b"]) == TOP8


def test_graph_tab_shows_the_structural_diff_and_a_layer(builds_root):
    at = _open(ab_tab="Graph")
    assert any("layers 0–29 differ only in attention: −2 tile, −2 expand_dims, −4 const each" in m.value
               for m in at.markdown)
    table = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    assert list(table["layer"])[:2] == ["0", "1"] and list(table["delta_ops"])[:30] == [-8] * 30
    assert at.selectbox(key="ab_graph_layer").value == "0"
    at.selectbox(key="ab_graph_layer").set_value("outside").run()
    assert not at.exception
    nodes = next(d.value for d in at.dataframe if "node" in d.value.columns)
    assert set(nodes["side"]) == {"A", "B"} and "gather" in set(nodes["title"])
    at.segmented_control(key="ab_graph_mode").set_value("B only").run()
    assert not at.exception
    nodes = next(d.value for d in at.dataframe if "node" in d.value.columns)
    assert set(nodes["side"]) == {"B"} and "tile" not in set(nodes["title"])  # the qfold program alone


def test_the_graph_frame_opens_full_width_and_in_a_new_tab_of_its_own(builds_root):
    """Issue 44: a full-width view of A and B (each side fitted to the width, a taller frame) and a new-tab view of
    the same frame, addressed by the URL (the pair, the layer, the sides)."""
    from urllib.parse import parse_qs, urlsplit

    at = _open(ab_a=FP16[0], ab_b=FP16[1], ab_tab="Graph", ab_graph_layer="3")
    (link,) = [e for e in at.get("link_button") if e.proto.label == "Open in a new tab"]
    url = urlsplit(link.proto.url)
    assert url.path == "./graph_page"
    query = parse_qs(url.query)
    assert (query["a"], query["b"], query["layer"], query["side"]) == ([FP16[0]], [FP16[1]], ["3"], ["ab"])
    (frame,) = at.get("iframe")
    assert 'id="qg-z75" checked' in frame.proto.srcdoc  # in the page: 75%
    at.session_state["ab_graph_frame"] = "full width"
    at.run()
    (frame,) = at.get("iframe")
    assert 'id="qg-zfit" checked' in frame.proto.srcdoc and "height:1336px" in frame.proto.srcdoc
    tab = new_app(180)  # the new tab: a session of its own, from the URL alone
    for key, values in query.items():
        tab.query_params[key] = values if len(values) > 1 else values[0]
    tab.switch_page("app_pages/graph_page.py")
    tab.run()
    assert not tab.exception, [e.value for e in tab.exception]
    (alone,) = tab.get("iframe")
    assert 'id="qg-zfit" checked' in alone.proto.srcdoc
    assert alone.proto.srcdoc.count("<svg") == 2  # A and B, the layer asked for
    assert any(c.value.startswith("layer 3: A") for c in tab.caption)
