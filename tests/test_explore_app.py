"""AppTest: the Graph tab's "Open the whole program in Model Explorer" on the shipped fp16 pair: the bundle download
with the Placement tab's plans joined in; no link where the app is not served on localhost; where it is, at most two
Model Explorer instances per session, each stopped by its button or with the session."""

from __future__ import annotations

import gc
import time

import pytest

from analyzer.analysis.record import load_analysis
from analyzer.report import explorer as mx
from analyzer.report.catalog import SHIPPED_DIR, shipped_analyses
from app_pages import explorer_tab
from tests.placement_plans import plan_bytes, slice_update_on_cpu
from tests.test_app import new_app

FP16 = ("shipped:exaone-4.0-1.2b-repeat_kv-state-ctx4096", "shipped:exaone-4.0-1.2b-qfold-state-ctx4096")
PLAN = "a.plan.json"

pytestmark = pytest.mark.skipif(not {"repeat_kv", "qfold"} <= set(shipped_analyses()),
                                reason="analyzer/shipped/ lacks the default analyses")


def _graph_tab(**state):
    at = new_app(240)
    at.session_state["ab_a"], at.session_state["ab_b"] = FP16
    at.session_state["ab_tab"] = "Graph"
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _captions(at) -> str:
    return "\n".join(c.value for c in at.caption)


def test_the_bundle_download_carries_the_placement_tabs_plan(builds_root):
    a = load_analysis(SHIPPED_DIR / f"{FP16[0].removeprefix('shipped:')}.analysis.json")
    at = _graph_tab(ab_plans={PLAN: plan_bytes(a, slice_update_on_cpu)}, ab_plan_choice_A=PLAN)
    assert "Download the bundle (zip)" in [b.proto.label for b in at.get("download_button")]
    text = _captions(at)
    assert "20 files: `a.graph.json`" in text, text  # 19, and A's device overlay
    assert "With the Placement tab's plans joined (A\\: a\\.plan\\.json)" in text, text  # the name is text
    assert "offered only when this app is served on localhost" in text  # AppTest has no localhost request
    at.segmented_control(key="ab_mx_which").set_value("B").run()
    assert not at.exception
    assert "No placement plan picked" in _captions(at)


def test_at_most_two_instances_per_session_stopped_with_it(builds_root, monkeypatch):
    monkeypatch.setattr(explorer_tab, "serving_locally", lambda: True)
    at = _graph_tab()
    for which in ("A", "B"):
        at.segmented_control(key="ab_mx_which").set_value(which).run()
        at.button(key="ab_mx_start").click().run()
        assert not at.exception, [e.value for e in at.exception]
    instances = [inst for _, inst in at.session_state[explorer_tab.INSTANCES]]
    assert len(instances) == 2 and all(inst.alive for inst in instances)
    links = [b.proto.url for b in at.get("link_button")]
    assert [u for u in links if u.startswith("./graph_page?")], links  # the tab's own "open in a new tab"
    links = [u for u in links if not u.startswith("./graph_page?")]
    assert links == [inst.url for inst in instances]
    assert all(u.startswith(f"http://127.0.0.1:{inst.port}/?data=") for u, inst in zip(links, instances, strict=True))
    assert not [b for b in at.button if b.key == "ab_mx_start"]  # a third is not offered
    assert "2 instances run for this session" in _captions(at)
    first = instances[0]
    at.button(key=f"ab_mx_stop_0_{first.port}").click().run()
    assert not first.alive and len(at.session_state[explorer_tab.INSTANCES]) == 1
    assert [b for b in at.button if b.key == "ab_mx_start"]  # one may be started again
    proc, folder = instances[1].proc, instances[1].folder
    del at, instances, first
    for _ in range(100):  # the session is gone: its instance is stopped and its folder removed
        gc.collect()
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    assert proc.poll() is not None and not folder.exists()
    assert mx.explorer_installed()
