"""``qfold explore`` with the real Model Explorer package, in headless Chromium (issue 38): the tiny pair
(repeat_kv vs qfold) served by the command as a user runs it; both graphs load side by side, the layer groups
exist, the copies carry the replication overlay, searching a tile's output name finds it, and no request leaves
the machine but Model Explorer's own web font. Then hostile op names and types, served by the same instance, stay
text. Ctrl-C stops the server and removes its folder."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest

from analyzer.analysis.accounting import account
from analyzer.analysis.record import load_analysis
from analyzer.report import explorer as mx
from tests.test_browser import REPO, free_port
from tests.test_explore import HOSTILE, hostile_pair

pytestmark = pytest.mark.browser
START_S = 120
FONT_HOST = "fonts.gstatic.com"  # the web font Model Explorer's index.html names


@pytest.fixture(scope="module")
def served(tiny_builds):
    """``qfold explore A B --port P --no-browser``: its URL and the folder it serves; stopped with Ctrl-C (SIGINT)
    at the end, which must remove the folder."""
    port = free_port()
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-m", "analyzer", "explore", str(tiny_builds["repeat_kv"]),
                             str(tiny_builds["qfold"]), "--port", str(port), "--no-browser"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=log, text=True)
    lines = []
    deadline = time.monotonic() + START_S
    while not (lines and lines[-1].startswith("http://")):
        line = proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            log.seek(0)
            proc.kill()
            pytest.fail(f"qfold explore printed no URL: {lines} {log.read()[-2000:]}")
        lines.append(line.strip())
    folder = Path(re.search(r"mapping is in (\S+)/mapping\.json", "\n".join(lines)).group(1))
    assert lines[-1].startswith(f"http://127.0.0.1:{port}/?data=") and folder.is_dir()
    try:
        yield lines[-1], port, folder
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert not folder.exists()  # the temporary folder is gone with the server
        log.close()


def _open(page, url: str, label_b: str) -> list[str]:
    """Open ``url`` recording every request (anything not on 127.0.0.1 is refused: this machine is offline) until
    both panes' side panels are drawn."""
    requested: list[str] = []
    page.on("request", lambda r: requested.append(r.url))
    page.route("**/*", lambda r: r.continue_() if urlparse(r.request.url).hostname == "127.0.0.1" else r.abort())
    page.goto(url)
    page.get_by_text(f"B: {label_b} | B:main", exact=True).wait_for()
    page.get_by_text("Root-level nodes stats").nth(1).wait_for()
    return requested


def _rows(table) -> list[list[str]]:
    return [[c.strip() for c in row.split("\t")] for row in table.locator("tr").all_inner_texts()[1:]]


def test_the_pair_side_by_side_in_model_explorer(page, served, tiny_builds):
    url, port, _ = served
    label_a, label_b = (Path(tiny_builds[v]).name for v in ("repeat_kv", "qfold"))
    requested = _open(page, url, label_b)
    page.get_by_text(f"A: {label_a} | A:main", exact=True).wait_for()  # both graphs, one per pane
    assert page.get_by_text("GRAPH INFO").count() == 2
    panels = page.locator("node-data-provider-summary-panel")
    assert panels.count() == 2
    for k in range(2):  # the layer groups: each layer collapsed at the root, the rest outside
        names = [r[1] for r in _rows(panels.nth(k).locator("table").nth(1))]
        assert names == ["GraphInputs", "outside", "layers.0", "layers.1", "GraphOutputs"], names
    # the copies carry the replication overlay (the overlay each pane shows, its last column), A only
    analysis = load_analysis(tiny_builds["repeat_kv"])
    acct = account(analysis.program)
    tiles = [op.index for op in analysis.program.ops if op.kind == "tile"]
    for k, expected in ((0, tiles), (1, [])):
        panel = panels.nth(k)
        panel.get_by_placeholder("regex to filter nodes").nth(1).fill("^tile$")
        page.wait_for_timeout(300)
        rows = [r for r in _rows(panel.locator("table").nth(2)) if len(r) > 2]
        assert [r[1] for r in rows] == ["tile"] * len(expected)
        assert sorted(int(r[-1]) for r in rows) == sorted(acct.ops[i].replication for i in expected)
        assert all(r[-2] == "only in A" for r in rows)
    # searching a tile's output name finds the tile, in its layer's attention
    name = max((analysis.program.ops[i].name for i in tiles), key=len)  # "x_7", not "x" (a parameter's name too)
    search = page.get_by_placeholder("Search nodes/layers by regex").first
    search.fill(f"^{re.escape(name)}$")
    search.press("Enter")
    found = page.locator("xpath=//*[contains(text(), 'Click to locate node')]/ancestor::*[contains(., 'result')][1]")
    found.first.wait_for()
    text = found.first.inner_text()
    assert re.match(r"[1-4] results?", text) and "layers." in text and "self_attn" in text and "tile" in text, text
    outside = {urlparse(u).hostname for u in requested} - {"127.0.0.1"}
    assert outside <= {FONT_HOST}, outside
    assert any(urlparse(u).port == port for u in requested)


def test_hostile_op_names_and_types_stay_text(page, served, tiny_builds, tmp_path):
    """Names from any package, served by the same Model Explorer: no markup is made of them, no script runs."""
    _, port, _ = served
    a, b = hostile_pair((load_analysis(tiny_builds["repeat_kv"]), load_analysis(tiny_builds["qfold"])))
    bundle = mx.build_bundle(mx.ExploreSide("evil", (a,)), mx.ExploreSide("qfold", (b,)))
    bundle.write(tmp_path)
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    _open(page, bundle.url(tmp_path, port), "qfold")
    panel = page.locator("node-data-provider-summary-panel").first
    panel.get_by_placeholder("regex to filter nodes").nth(1).fill("onerror")
    page.wait_for_timeout(300)
    labels = [r[1] for r in _rows(panel.locator("table").nth(2)) if len(r) > 2]
    assert labels == [HOSTILE[4]], labels  # the hostile op type, as text
    search = page.get_by_placeholder("Search nodes/layers by regex").first
    search.fill(re.escape(HOSTILE[2]))
    search.press("Enter")
    page.get_by_text(re.compile(r"\d+ results?")).first.wait_for()
    page.wait_for_timeout(500)
    assert dialogs == []
    assert page.locator("img[src='x']").count() == 0
    assert page.evaluate("() => [...document.scripts].every(s => !s.text.includes('alert('))")
    assert json.loads(bundle.files["a.graph.json"])["graphs"][0]["id"] == "A:main"
