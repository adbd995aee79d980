"""The dashboard works with no outside network: a session that opens every page (by URL and through the
sidebar) requests nothing from any host but the app's own (issue: page icons were fetched from a font CDN)."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from tests.test_browser import assert_no_crash, go, settle

pytestmark = pytest.mark.browser

PAGES = {"": "A/B", "builds": "Builds", "device_logs": "Device logs", "bandwidth": "Bandwidth",
         "sweeps": "Sweeps", "export": "Export"}


def test_a_session_requests_nothing_outside_the_app(page, server):
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    for path in PAGES:
        page.goto(f"{server}/{path}")
        page.locator('[data-testid="stSidebarNav"]').first.wait_for()
        settle(page)
        assert_no_crash(page)
    for name in PAGES.values():
        go(page, name)
        settle(page)
        assert_no_crash(page)
    own = urlparse(server).netloc
    outside = sorted({u for u in requested if urlparse(u).scheme in ("http", "https") and urlparse(u).netloc != own})
    assert requested and not outside, outside
