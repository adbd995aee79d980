"""The Device logs paste box in a real browser (Playwright driving Debian's chromium, as tests/test_browser.py):
paste llama.cpp's README llama-bench table, and the accepted runs it downloads hold its tg rate as a decode run."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.test_browser import assert_no_crash

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parent.parent
README_TABLE = (REPO / "examples" / "llama_bench_readme.md").read_text(encoding="utf-8")


def test_the_paste_box_reads_the_readme_table_as_a_decode_and_a_prefill_run(page, server):
    page.goto(f"{server}/device_logs")
    page.get_by_text("Paste a table or runner output").first.click()
    page.get_by_label("Pasted text").fill(README_TABLE)
    page.get_by_role("button", name="Read the pasted text").click()
    page.get_by_text("1 decode, 1 prefill and 0 mixed run(s)").first.wait_for()
    assert_no_crash(page)

    with page.expect_download() as info:
        page.locator(".st-key-logs_accepted_csv button").click()
    with open(info.value.path(), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [(r["file_name"], r["phase"], r["tok_per_s"], r["context_length"], r["build"]) for r in rows] == [
        ("pasted text 1", "prefill", "5765.41", "512", "qwen2 1.5B Q4_0"),
        ("pasted text 1", "decode", "197.71", "128", "qwen2 1.5B Q4_0"),
    ]
    assert page.get_by_text("0 error(s)").count() >= 1  # warnings only (no device in the table), no error
