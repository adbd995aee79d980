"""The A/B page's Decode · prefill · roofline tab in a real browser (issue 44): the default pair finds the shipped
prefill-64 pair, the tab predicts at the page's one bandwidth, and the roofline's axes, read from the plot as
plotly drew it, hold the points with labels that read as values (not "1, 10³¹, 10⁶², …")."""

from __future__ import annotations

import math

import pytest

from tests.test_browser import assert_no_crash, settle

pytestmark = pytest.mark.browser

TAB = "Decode · prefill · roofline"
# The drawn roofline: its axes' ranges (log10), every trace's x and y, and the tick labels plotly wrote.
READ_PLOT = """() => {
    const plot = [...document.querySelectorAll('.js-plotly-plot')]
        .find(p => p.layout && p.layout.title && String(p.layout.title.text).includes('Roofline:'));
    if (!plot) return null;
    const full = plot._fullLayout;
    return {x: full.xaxis.range, y: full.yaxis.range, xtype: full.xaxis.type, ytype: full.yaxis.type,
            traces: plot.data.map(t => ({name: t.name, mode: t.mode, x: Array.from(t.x), y: Array.from(t.y)})),
            xticks: [...plot.querySelectorAll('.xtick text')].map(t => t.textContent),
            yticks: [...plot.querySelectorAll('.ytick text')].map(t => t.textContent)};
}"""


def test_the_roofline_tab_finds_the_prefill_pair_at_the_pages_bandwidth_with_axes_that_fit(page, server):
    page.goto(server)
    page.get_by_text("tile ops, A → B").first.wait_for()
    page.get_by_text("Predicted tok/s use 55,900 MB/s").first.wait_for()  # the headline's bandwidth
    page.get_by_role("tab", name=TAB).click()
    page.get_by_text("Decode and prefill side by side").first.wait_for()
    page.wait_for_function(f"() => ({READ_PLOT})() !== null")  # the roofline drawn (another tab's chart is hidden)
    settle(page)
    assert_no_crash(page)

    # one bandwidth: the tab starts from the page's setting, and says so
    assert float(page.get_by_role("spinbutton", name="Bandwidth (GB/s)").input_value()) == pytest.approx(55.9)
    page.get_by_text("55,900 MB/s (the page's setting)").first.wait_for()
    # the shipped fp16 prefill-64 pair is found for the top8 decode pair, and said to differ in compression
    assert page.get_by_text("has no prefill analysis").count() == 0
    assert page.get_by_text("compression fp16, not top8").count() == 2

    drawn = page.evaluate(READ_PLOT)
    assert drawn is not None and drawn["xtype"] == drawn["ytype"] == "log"
    points = [t for t in drawn["traces"] if t["mode"] == "markers+text" and t["name"] != "ridge"]
    assert len(points) == 4  # A and B, decode and prefill
    for axis in ("x", "y"):
        values = [math.log10(v) for t in points for v in t[axis] if v and v > 0]
        lo, hi = drawn[axis]
        assert lo <= min(values) and max(values) <= hi, (axis, drawn[axis], values)
        assert (hi - lo) - (max(values) - min(values)) <= 3  # no more than 3 decades beyond the points
    for labels in (drawn["xticks"], drawn["yticks"]):
        assert labels and all(label.replace(",", "").replace(".", "").rstrip("kMGT").isdigit() for label in labels), \
            labels  # values (1, 10, 2k, 10T), never 10³¹
