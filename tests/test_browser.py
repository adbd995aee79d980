"""The dashboard in a real browser: Debian's headless chromium driven by Playwright against ``streamlit run``.

Flow: open the app on the A/B page, upload the example device log, see the bandwidth chart, download the
HTML report, and check that an oversize upload and a malformed CSV give an error message, not a traceback.
Playwright never downloads a browser here (no ``playwright install``): it drives /usr/bin/chromium.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from analyzer.report.catalog import shipped_analyses

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
EXAMPLE_LOG = REPO / "examples" / "writeup_device_logs.csv"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SERVER_START_S = 60
WAIT_MS = 60_000
CRASH_TEXT = re.compile(r"Traceback|This app has encountered an error")

if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (scripts/ensure-system-packages) to run "
                "browser tests", allow_module_level=True)
from playwright import sync_api  # noqa: E402 (after the chromium check)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def streamlit_server(builds: Path, **env: str) -> Iterator[str]:
    """``streamlit run app.py`` on ``builds`` (and ``env``), answering on a free port: its URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "streamlit", "run", "app.py", "--server.headless", "true", "--server.port", str(port),
           "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"]
    log = tempfile.TemporaryFile("w+")  # a file, not a pipe: a pipe nobody reads stops a long-lived server when full
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, QFOLD_BUILDS=str(builds), PYTHONPATH=str(REPO), **env),
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if proc.poll() is not None:
                log.seek(0)
                pytest.fail(f"streamlit exited with {proc.returncode}: {log.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"streamlit did not answer /_stcore/health within {SERVER_START_S} s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


VIEWPORT = {"width": 1500, "height": 1000}


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[sync_api.BrowserContext]:
    """Headless chromium on a profile folder (``profile``): its pages share Chromium's code cache, the JavaScript it
    compiled for an earlier page of the same server, which an off-the-record context (``browser.new_context``)
    never keeps. Every page view of the app loads Streamlit's whole frontend: ~4.5 s of CPU a view with nothing
    cached here, ~1.5-2 s less with it. Each test still gets a page of its own (``own_page``)."""
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(str(profile), executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                                       timeout=WAIT_MS, viewport=VIEWPORT, accept_downloads=True)
        try:
            yield context
        finally:
            context.close()


@contextlib.contextmanager
def own_page(profile: sync_api.BrowserContext) -> Iterator[sync_api.Page]:
    """A new page (tab) in the browser's profile that leaves nothing for the next test: its origin's local and
    session storage and the profile's cookies are cleared when it closes. It starts blank: a test opens the page
    it is about (a first view of the A/B page it does not need costs ~8 s of CPU)."""
    page = profile.new_page()
    page.set_default_timeout(WAIT_MS)
    try:
        yield page
    finally:
        with contextlib.suppress(sync_api.Error):  # a page that never left about:blank has no storage
            page.evaluate("() => { localStorage.clear(); sessionStorage.clear(); }")
        page.close()
        profile.clear_cookies()


def go(page, name: str) -> None:
    """Navigate inside the same session (the sidebar), so session state (uploads) is kept."""
    page.get_by_role("link", name=name, exact=True).click()


def upload(page, files) -> None:
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').first.set_input_files(files)


# The page has been idle (no script run in progress: Streamlit's status widget shows its running icon only during
# one; every plotly chart drawn, its SVG in the page) for ``quiet`` ms, since the call that passed ``token``. Polled
# inside the page (``wait_for_function``), not by a round trip from Python per poll.
SETTLE_JS = """([quiet, token]) => {
    const idle = !document.querySelector('[data-testid="stStatusWidgetRunningIcon"]')
        && [...document.querySelectorAll('[data-testid="stPlotlyChart"]')].every(c => c.querySelector('svg.main-svg'));
    const now = performance.now(), state = window.__qfoldSettle;
    if (!idle || !state || state.token !== token || state.since === null) {
        window.__qfoldSettle = {token, since: idle ? now : null};
        return false;
    }
    return now - state.since >= quiet;
}"""


def settle(page, quiet_s: float = 0.5, timeout_s: float = WAIT_MS / 1000) -> None:
    """Wait until the page has been idle for ``quiet_s`` (a click's rerun starts within that): what a fixed
    wait hoped for, checked, so a slow machine waits longer and a fast one does not wait for nothing."""
    try:
        page.wait_for_function(SETTLE_JS, arg=[quiet_s * 1000, uuid.uuid4().hex], polling=50, timeout=timeout_s * 1000)
    except sync_api.TimeoutError:
        raise AssertionError(f"the page was not idle for {quiet_s} s within {timeout_s} s") from None


def assert_no_crash(page) -> None:
    body = page.locator("body").inner_text()
    assert not CRASH_TEXT.search(body), body[-2000:]


def test_ab_logs_bandwidth_export_flow(page, server, tmp_path):
    # A/B: the default pair, tiles A → B
    page.goto(server)
    page.get_by_text("tile ops, A → B").first.wait_for()
    assert {"repeat_kv", "qfold"} <= set(shipped_analyses())
    expected = "60 → 0"  # the shipped full-size default pair: the write-up's 60 tiles, none after the fold
    page.get_by_text(expected, exact=True).first.wait_for()
    page.screenshot(path=str(tmp_path / "ab.png"), full_page=True)
    assert_no_crash(page)

    # Device logs: upload the example log
    go(page, "Device logs")
    page.get_by_text("Upload device logs").first.wait_for()
    page.get_by_role("button", name="Remove the example").click()  # an upload adds to the example: uploaded alone
    page.get_by_role("button", name="Show the example again").wait_for()
    upload(page, str(EXAMPLE_LOG))
    page.get_by_role("button", name="Remove my logs").wait_for()
    page.get_by_text("Every row accepted (6 runs)").first.wait_for()
    assert_no_crash(page)

    # Bandwidth: the chart and the write-up's cross-check
    go(page, "Bandwidth")
    page.locator(".js-plotly-plot").first.wait_for()
    page.get_by_text("Measured tok/s vs bytes per token").first.wait_for()
    page.get_by_text("inferred difference, MB/token").first.wait_for()
    page.get_by_text("1,712.1", exact=True).first.wait_for()
    assert_no_crash(page)

    # Export: the HTML report downloads and is self-contained
    go(page, "Export")
    button = page.get_by_role("button", name="Download the HTML report")
    button.wait_for()
    with page.expect_download(timeout=WAIT_MS) as info:
        button.click()
    html = Path(info.value.path()).read_text(encoding="utf-8")
    assert "qfold A/B report" in html and expected in html
    assert not re.search(r"<script[^>]*\bsrc\s*=\s*[\"']?\s*(?:https?:)?//", html, re.IGNORECASE)
    assert_no_crash(page)


def test_bad_uploads_show_messages_not_tracebacks(page, server):
    page.goto(f"{server}/device_logs")
    page.get_by_text("Upload device logs").first.wait_for()

    # over server.maxUploadSize (5 MB): refused before it reaches the app
    upload(page, [{"name": "huge.csv", "mimeType": "text/csv", "buffer": b"device,build,tok_per_s\n" * 300_000}])
    page.get_by_text(re.compile(r"must be 5(\.0)?\s*MB or smaller", re.IGNORECASE)).first.wait_for()
    assert_no_crash(page)

    # a malformed CSV: rejected with the reason, the page still works
    upload(page, [{"name": "broken.csv", "mimeType": "text/csv", "buffer": b"device,build\n\x00\x01\x02 binary"}])
    page.get_by_text(re.compile(r"broken\.csv.*rejected as a whole")).first.wait_for()
    page.get_by_text("NUL byte").first.wait_for()
    assert_no_crash(page)
