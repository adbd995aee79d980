"""The dashboard's trust-breaking bugs of issue #16, in a real browser (Debian chromium through Playwright, one
``streamlit run`` server for the module): the .mlpackage download arrives and unzips to a package ``inspect``
reads; a running conversion shows a running state, then "built in N s"; an A/B of two models says so; a reload
keeps the chosen pair."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from analyzer.analysis.record import load_analysis
from analyzer.convert.launch import run_build
from analyzer.model.sources import resolve_source
from analyzer.model.spec import BuildSpec
from tests.conftest import TINY_CTX, TINY_OVERRIDES
from tests.test_browser import REPO, WAIT_MS, assert_no_crash, sync_api

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def other_model(tiny_builds) -> Path:
    """A tiny qfold build of another model (qwen3) in the same builds folder as the tiny EXAONE pair."""
    source = resolve_source("qwen3-0.6b", TINY_OVERRIDES)
    return run_build(BuildSpec(source, "qfold", "state", TINY_CTX), next(iter(tiny_builds.values())).parent).path


def pick(pg, label: str, option_text: str) -> None:
    """Choose the option containing ``option_text`` in the selectbox labelled ``label``. The text is typed first:
    the dropdown renders only the options in view (a virtual list), so with more builds than fit, an option below
    the fold is not in the page until the list is filtered to it (CI's shared builds folder: stop 25)."""
    box = pg.get_by_role("combobox", name=label)
    box.click()
    box.press_sequentially(option_text)
    pg.get_by_role("option").filter(has_text=option_text).first.click()


def shown(pg, label: str) -> str:
    """The text a selectbox shows for its current value."""
    return pg.get_by_role("combobox", name=label).input_value()


def test_the_mlpackage_download_unzips_to_a_package_inspect_reads(page, server, tiny_builds, tmp_path):
    key = tiny_builds["qfold"].name
    page.goto(f"{server}/export?a=build:{key}&b=build:{key}")
    button = page.get_by_role("button", name="Download the .mlpackage (zip)")
    button.wait_for()
    with page.expect_download(timeout=WAIT_MS) as info:
        button.click()
    download = info.value
    assert download.failure() is None and download.suggested_filename.endswith(".mlpackage.zip")
    zip_path = tmp_path / download.suggested_filename
    download.save_as(zip_path)
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(tmp_path)
        (root,) = {Path(n).parts[0] for n in zf.namelist()}
    assert root.endswith(".mlpackage")
    out = subprocess.run([sys.executable, "-m", "analyzer", "inspect", str(tmp_path / root), "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=120, check=True)
    inspected = json.loads(out.stdout)
    expected = load_analysis(tiny_builds["qfold"])
    assert inspected["total_ops"] == expected.summary.total_ops
    assert inspected["bytes_per_token"]["total"] == expected.bytes_per_token.total
    assert_no_crash(page)


def test_a_running_conversion_shows_a_running_state(page, server, tiny_builds):
    page.goto(f"{server}/builds")
    page.get_by_text("New build").first.wait_for()
    pick(page, "Preset", "qwen3-0.6b")
    page.get_by_label("Decoder layers (0 = as in the config)").fill("1")
    page.keyboard.press("Enter")
    page.get_by_label("Context length (cache slots)").fill("32")
    page.keyboard.press("Enter")
    page.get_by_role("button", name="Remove repeat_kv").click()
    page.get_by_text("of a limit of").first.wait_for()  # the cost check ran first
    page.get_by_role("button", name="Convert").click()
    box = page.locator('[data-testid="stExpander"]').filter(has_text="qwen3-0.6b-qfold-state-ctx32").first
    box.locator('[data-testid="stExpanderIconSpinner"]').wait_for()  # running, with stage and seconds
    assert box.locator('[data-testid="stExpanderIconCheck"]').count() == 0
    page.wait_for_timeout(1500)
    assert box.locator('[data-testid="stExpanderIconSpinner"]').count() == 1  # still running after a refresh
    assert " s" in box.locator("summary").inner_text()
    finished = page.locator("summary").filter(has_text="built in")
    finished.first.wait_for(timeout=180_000)
    assert finished.first.locator('[data-testid="stExpanderIconCheck"]').count() == 1
    assert_no_crash(page)


def test_an_ab_of_two_models_says_so(page, server, tiny_builds, other_model):
    page.goto(server)
    page.get_by_text("tile ops, A → B").first.wait_for()
    pick(page, "A (baseline)", f"build {tiny_builds['repeat_kv'].name.rsplit('-', 1)[1]}")
    pick(page, "B (candidate)", f"build {other_model.name.rsplit('-', 1)[1]}")
    warning = page.get_by_text("A and B differ in model (exaone-4.0-1.2b (exaone4) vs qwen3-0.6b (qwen3))")
    warning.first.wait_for()
    page.get_by_role("button", name="Open the matching pair of A").wait_for()
    assert_no_crash(page)


def test_reloading_the_ab_page_keeps_the_pair(page, server, tiny_builds):
    page.goto(server)
    page.get_by_text("tile ops, A → B").first.wait_for()
    pick(page, "A (baseline)", f"build {tiny_builds['repeat_kv'].name.rsplit('-', 1)[1]}")
    pick(page, "B (candidate)", f"build {tiny_builds['qfold'].name.rsplit('-', 1)[1]}")
    page.wait_for_function(f"new URLSearchParams(location.search).get('b') === 'build:{tiny_builds['qfold'].name}'")
    before = shown(page, "A (baseline)"), shown(page, "B (candidate)")
    assert tiny_builds["qfold"].name.rsplit("-", 1)[1] in before[1]
    page.reload()
    page.get_by_text("tile ops, A → B").first.wait_for()
    assert (shown(page, "A (baseline)"), shown(page, "B (candidate)")) == before
    query = parse_qs(urlparse(page.url).query)
    assert query["a"] == [f"build:{tiny_builds['repeat_kv'].name}"]
    assert query["b"] == [f"build:{tiny_builds['qfold'].name}"]
    assert_no_crash(page)


def test_a_core_ai_ab_names_the_backend_then_opens_its_twin(page, server, tiny_builds, coreai_builds):
    """Core ML repeat_kv vs Core AI Q-fold (issue 19): the pickers say which is Core AI, the apples-to-apples warning
    names the backend, and B's matching pair is the Core AI repeat_kv build (a twin shares the backend)."""
    page.goto(server)
    page.get_by_text("tile ops, A → B").first.wait_for(timeout=3 * WAIT_MS)  # a fresh server's first page: slow
    pick(page, "A (baseline)", f"build {tiny_builds['repeat_kv'].name.rsplit('-', 1)[1]}")
    pick(page, "B (candidate)", f"build {coreai_builds['qfold'].name.rsplit('-', 1)[1]}")
    assert "KV state · Core AI · build" in shown(page, "B (candidate)")
    assert "Core AI" not in shown(page, "A (baseline)")
    page.get_by_text("A and B differ in backend (Core ML vs Core AI)").first.wait_for()
    page.get_by_role("button", name="Open the matching pair of B").click()
    twin = f"KV state · Core AI · build {coreai_builds['repeat_kv'].name.rsplit('-', 1)[1]}"
    sync_api.expect(page.get_by_role("combobox", name="A (baseline)")).to_have_value(re.compile(re.escape(twin)),
                                                                                          timeout=WAIT_MS)
    assert "Core AI" in shown(page, "B (candidate)")
    sync_api.expect(page.get_by_text("A and B differ in")).to_have_count(0, timeout=WAIT_MS)
    assert_no_crash(page)
