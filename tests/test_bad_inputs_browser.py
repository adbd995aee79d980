"""Issue #24's payloads in a real browser: ``?a=![x](http://host/x.png)`` and ``?b=[Session expired: sign in
again](http://host/phish)`` on every page, a device name and a quantization from an uploaded log and a package's
name and folder, all with markdown and HTML in them, show as plain text; no image or link to that host is made, no
script runs (a dialog handler stays silent), no request leaves the machine, and no page shows Streamlit's error
screen, with one corrupt build folder in the builds folder. Bad paths typed into the Builds page (``~nosuchuser``, a
symbolic link loop), "Fold it" with a missing input spec and a builds folder that is a file are messages too."""

from __future__ import annotations

import contextlib
import os
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bad_input_packages import gqa_package
from tests.test_bad_inputs_app import DEVICE, PACKAGE_NAME, PACKAGE_PARENT, PAYLOAD_LOG
from tests.test_browser import CHROMIUM, WAIT_MS, assert_no_crash, go, own_page, settle, streamlit_server, upload

pytestmark = pytest.mark.browser

if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is missing", allow_module_level=True)

REPO = Path(__file__).resolve().parent.parent
HOST = "198.51.100.7"  # TEST-NET-2 (RFC 5737): nothing answers there
PAYLOADS = {"a": f"![x](http://{HOST}/x.png)", "b": f"[Session expired: sign in again](http://{HOST}/phish)",
            "pkg": "<img src=x onerror=alert(1)>.mlpackage"}
PAGES = ("", "builds", "device_logs", "bandwidth", "sweeps", "export")
READY = {"": "is not among the analyses", "builds": "Cached builds", "device_logs": "Accepted runs",
         "bandwidth": "Fits per device", "sweeps": "Run the sweep", "export": "A/B report"}  # text once drawn


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A builds folder with one corrupt build; a data root with a package to fold, one whose name and folder are
    payloads, a symbolic link loop, and a log whose device name is one."""
    root = tmp_path_factory.mktemp("bad-browser")
    corrupt = root / "builds" / "corrupt-build-0123456789"
    corrupt.mkdir(parents=True)
    (corrupt / "analysis.json").write_text('{"schema_version": 2, "program": ' + "9" * 5000 + "}")
    gqa_package(root / "gqa.mlpackage")
    parent = root.joinpath(*PACKAGE_PARENT)
    parent.mkdir(parents=True)
    os.rename(gqa_package(root / "named.mlpackage"), parent / PACKAGE_NAME)
    (root / "loop.mlpackage").symlink_to(root / "loop.mlpackage")
    (root / "payload-log.csv").write_bytes(PAYLOAD_LOG)
    return root


@pytest.fixture(scope="module")
def server(data) -> Iterator[str]:
    with streamlit_server(data / "builds", QFOLD_DATA_ROOTS=str(data)) as url:
        yield url


@contextlib.contextmanager
def _page(browser, requested: list[str], dialogs: list[str]):
    with own_page(browser) as page:
        page.set_viewport_size({"width": 1400, "height": 1000})
        page.set_default_timeout(3 * WAIT_MS)  # a first page view imports the analyzer: slow on a busy machine
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.on("request", lambda r: requested.append(r.url))
        yield page


def _assert_text_only(page, where: str) -> None:
    """No element made from a payload: no image or link to the payload host, no link saying "Session expired",
    no bold "pkg", no Streamlit error screen."""
    assert_no_crash(page)
    html = page.content()
    for attr in ("src", "href"):
        at = html.find(f'{attr}="http://{HOST}')
        assert at < 0, (where, html[max(0, at - 300):at + 200])
    assert page.locator("a", has_text="Session expired").count() == 0, where
    assert page.locator("a", has_text="sign in").count() == 0, where
    assert page.locator("strong", has_text="pkg").count() == 0, where
    assert page.locator('img[src="x"]').count() == 0, where


def _outside(server: str, requested: list[str]) -> list[str]:
    own = urllib.parse.urlparse(server).netloc
    return sorted({u for u in requested if urllib.parse.urlparse(u).scheme in ("http", "https")
                   and urllib.parse.urlparse(u).netloc != own})


def test_link_payloads_are_plain_text_on_every_page(server, browser):
    query = urllib.parse.urlencode(PAYLOADS)
    dialogs: list[str] = []
    requested: list[str] = []
    with _page(browser, requested, dialogs) as page:
        for path in PAGES:
            page.goto(f"{server}/{path}?{query}")
            page.get_by_text(READY[path]).first.wait_for()
            settle(page)  # charts drawn
            _assert_text_only(page, path)
            if path == "":  # the A/B page says what the link asked for, as the characters it is
                body = page.locator("body").inner_text()
                assert PAYLOADS["a"] in body and PAYLOADS["b"] in body, body[-1500:]
        page.goto(f"{server}/builds")
        page.get_by_text("Unreadable build folder").first.wait_for()
    assert not dialogs, dialogs
    assert requested and not _outside(server, requested)


def test_device_and_package_payloads_are_plain_text(server, data, browser):
    """A log's device name (the fitted bandwidth's source, the measured card, the Bandwidth page's captions and
    chart legends) and a package's name and folder (the A/B pickers, headings and charts, the Export page)."""
    dialogs: list[str] = []
    requested: list[str] = []
    package = str(data.joinpath(*PACKAGE_PARENT, PACKAGE_NAME))
    with _page(browser, requested, dialogs) as page:
        page.goto(f"{server}/device_logs?bw=fitted")
        upload(page, str(data / "payload-log.csv"))
        page.locator("code", has_text="onerror=alert(2)").first.wait_for()  # its build label's mapping: read
        _assert_text_only(page, "device logs")
        for name, ready in (("A/B", "Predicted tok/s use"), ("Bandwidth", "Fits per device"),
                            ("Export", "A/B report")):
            go(page, name)
            page.get_by_text(ready).first.wait_for()
            settle(page)  # charts drawn
            _assert_text_only(page, name)
            if name == "A/B":
                assert DEVICE in page.locator("body").inner_text()  # shown, as the characters it is
        query = urllib.parse.urlencode({"pkg": package, "b": f"package:{package}"})
        page.goto(f"{server}/?{query}")
        page.get_by_text("tile ops").first.wait_for()
        settle(page)
        _assert_text_only(page, "A/B with the package")
        shown = PACKAGE_NAME.removesuffix(".mlpackage").replace("<", "&lt;").replace(">", "&gt;")
        assert shown in page.content()  # in the picker and the tabs' headings, as text
        go(page, "Export")
        page.get_by_text("A/B report").first.wait_for()
        _assert_text_only(page, "Export with the package")
    assert not dialogs, dialogs
    assert requested and not _outside(server, requested)


def test_bad_paths_and_a_missing_spec_are_messages(server, data, browser):
    dialogs: list[str] = []
    requested: list[str] = []
    with _page(browser, requested, dialogs) as page:
        page.goto(f"{server}/builds?{urllib.parse.urlencode({'pkg': str(data / 'gqa.mlpackage')})}")
        field = page.get_by_label("Path of the .mlpackage or .aimodel on this server")
        for typed in ("~nosuchuser/model.mlpackage", str(data / "loop.mlpackage")):
            field.fill(typed)
            page.get_by_role("button", name="Analyse").click()
            page.get_by_text(f"{typed}: cannot resolve it").first.wait_for()
            assert_no_crash(page)
        page.get_by_label("Input spec (optional)", exact=False).fill(str(data / "no-such-spec.json"))
        page.get_by_role("button", name="Fold it").click()
        page.get_by_text("No such file", exact=False).first.wait_for()
        assert_no_crash(page)
    assert not dialogs, dialogs


def test_a_builds_folder_that_is_a_file_is_a_message_on_every_page(data, browser):
    with streamlit_server(data / "payload-log.csv", QFOLD_DATA_ROOTS=str(data)) as url:
        with _page(browser, [], []) as page:
            for path in PAGES:
                page.goto(f"{url}/{path}")
                page.get_by_text("the builds folder is not a folder").first.wait_for()
                assert_no_crash(page)
