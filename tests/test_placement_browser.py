"""The A/B page's Placement tab in a real browser (Debian chromium via Playwright, as tests/test_browser.py): a
plan per side uploaded, both sides' placement shown, and the warning when B has more ops off the Neural Engine
than A; the Graph tab then badges B's slice_update ops as on the CPU."""

from __future__ import annotations

import pytest

from analyzer.analysis.record import load_analysis
from analyzer.report.catalog import shipped_analyses
from analyzer.report.graphview import dot_binary
from tests.placement_plans import all_ane, plan_bytes, slice_update_on_cpu
from tests.test_browser import REPO, assert_no_crash

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not {"repeat_kv", "qfold"} <= set(shipped_analyses()), reason="no shipped analyses"),
]
SHIPPED = REPO / "analyzer" / "shipped"


def test_placement_of_a_and_b_and_the_warning_when_b_moves_ops_off_the_neural_engine(page, server, tmp_path):
    # the page opens on the pair the example device logs measured: the top8 repeat_kv / Q-fold analyses
    plans = {}
    for side, variant, rule in (("A", "repeat_kv", all_ane), ("B", "qfold", slice_update_on_cpu)):
        analysis = load_analysis(SHIPPED / f"exaone-4.0-1.2b-{variant}-state-ctx4096-top8.analysis.json")
        plans[side] = tmp_path / f"{variant}.plan.json"
        plans[side].write_bytes(plan_bytes(analysis, rule))
    page.goto(server)
    page.get_by_text("20.39 → 54.30", exact=True).first.wait_for()
    page.get_by_role("tab", name="Placement").click()
    page.get_by_text("No plan for A or B yet.").first.wait_for()
    for side in "AB":
        page.locator(f'.st-key-ab_plan_upload_{side} [data-testid="stFileUploaderDropzoneInput"]').set_input_files(
            str(plans[side]))
        page.get_by_text(f"{plans[side].name} (qfold-compute-plan):").first.wait_for()
    page.get_by_text("B moves work off the Neural Engine onto the CPU: +60 ops (0 → 60)").first.wait_for()
    page.get_by_text("Off the Neural Engine: 0 ops").first.wait_for()  # A
    page.get_by_text("Off the Neural Engine: 60 ops").first.wait_for()  # B
    page.get_by_text("Where the ops ran: A vs B").first.wait_for()
    assert page.get_by_text("onto the GPU").count() == 0  # one warning per device that B loads more
    assert_no_crash(page)

    if dot_binary() is not None:  # the Graph tab badges ops by the same plans
        page.get_by_role("tab", name="Graph").click()
        frame = page.frame_locator('iframe[title="Graph of layer 0"]')
        frame.locator("#side-B svg g.node.device-CPU").first.wait_for()
        assert frame.locator("#side-A svg g.node.device-CPU").count() == 0
        assert frame.locator("#side-B svg g.node.optype-slice_update.device-CPU").count() == 2
        assert_no_crash(page)
