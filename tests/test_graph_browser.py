"""The Graph view in a real browser (Debian chromium via Playwright): the A/B page opens on the measured top8 pair,
the Graph tab draws layer 0 of repeat_kv and Q-fold side by side (two tiles on the repeat_kv side, none on the
Q-fold side), picking another layer (from the picker or the structural-diff table) redraws it, and the view asks
nothing of any outside host."""

from __future__ import annotations

import pytest

from analyzer.report.catalog import shipped_analyses
from analyzer.report.graphview import dot_binary
from tests.test_browser import WAIT_MS, assert_no_crash

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not {"repeat_kv", "qfold"} <= set(shipped_analyses()), reason="no shipped analyses"),
    pytest.mark.skipif(dot_binary() is None, reason="Graphviz 'dot' is not installed (the fallback has no frame)"),
]
ROW_PX = 35  # Streamlit's dataframe row height (header row the same)


@pytest.fixture
def watched_page(server, page):
    """A page on the app, with every URL it requests recorded."""
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.goto(server, timeout=WAIT_MS)
    return page, server, requested


def _graphs(page, layer: str):
    frame = page.frame_locator(f'iframe[title="Graph of layer {layer}"]')
    frame.locator("#side-A svg").wait_for()
    frame.locator("#side-B svg").wait_for()
    return frame


def _tiles(frame) -> tuple[int, int]:
    return (frame.locator("#side-A svg g.node.optype-tile").count(),
            frame.locator("#side-B svg g.node.optype-tile").count())


def test_graph_view_of_the_measured_pair(watched_page):
    page, server_url, requested = watched_page
    page.get_by_text("20.39 → 54.30", exact=True).first.wait_for()  # measured beside predicted, first screen
    page.get_by_text("measured tok/s (device logs)").first.wait_for()
    assert_no_crash(page)

    requested.clear()  # from here on: what the Graph view asks for (test_browser_offline covers whole sessions)
    page.get_by_role("tab", name="Graph").click()
    page.get_by_text("layers 0–29 differ only in attention: −2 tile, −2 expand_dims, −4 const each").first.wait_for()
    frame = _graphs(page, "0")
    assert _tiles(frame) == (2, 0)
    assert "repeat_kv" in frame.locator("#side-A h4").inner_text()
    assert "qfold" in frame.locator("#side-B h4").inner_text()
    assert frame.locator("#side-A svg g.node.kv-replication").count() == 2
    assert frame.locator("#side-A svg text", has_text="k_cache_0").count() >= 1
    assert_no_crash(page)

    # another layer from the picker: redrawn with that layer's cache
    picker = page.get_by_label("Layer to draw")
    picker.click()
    picker.fill("layer 5")
    page.get_by_role("option", name="layer 5", exact=True).click()
    frame = _graphs(page, "5")
    assert _tiles(frame) == (2, 0)
    assert frame.locator("#side-A svg text", has_text="k_cache_5").count() >= 1
    assert frame.locator("#side-A svg text", has_text="k_cache_0").count() == 0
    assert_no_crash(page)

    # a row of the structural-diff table opens its layer (row 4 = layer 3; the first column is the row marker)
    table = page.locator('[data-testid="stDataFrame"]').filter(has_text="verdict").first
    box = table.bounding_box()
    page.mouse.click(box["x"] + 16, box["y"] + ROW_PX * 4 + ROW_PX / 2)
    frame = _graphs(page, "3")
    assert _tiles(frame) == (2, 0)
    assert_no_crash(page)

    outside = sorted({u for u in requested if not u.startswith((server_url, "data:", "blob:", "about:"))})
    assert outside == [], outside
