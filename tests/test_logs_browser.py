"""The Device logs paste box in a real browser (Playwright driving Debian's chromium, as tests/test_browser.py):
paste llama.cpp's README llama-bench table beside the write-up's example log (a paste adds, it never replaces),
the accepted runs it downloads hold its tg rate as a decode run, and a reload keeps the paste and the example's
removal (issue 44)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from tests.test_browser import assert_no_crash, settle

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parent.parent
README_TABLE = (REPO / "examples" / "llama_bench_readme.md").read_text(encoding="utf-8")


def test_a_paste_adds_to_the_example_and_a_reload_keeps_both(page, server):
    page.goto(f"{server}/device_logs")
    page.get_by_text("6 decode, 0 prefill and 0 mixed run(s)").first.wait_for()  # the write-up's example
    page.get_by_text("Paste a table or runner output").first.click()
    page.get_by_label("Pasted text").fill(README_TABLE)
    page.get_by_role("button", name="Read the pasted text").click()
    page.get_by_text("7 decode, 1 prefill and 0 mixed run(s)").first.wait_for()  # added to the example
    page.get_by_text("shown beside your 1 log(s)").first.wait_for()
    assert_no_crash(page)

    with page.expect_download() as info:
        page.locator(".st-key-logs_accepted_csv button").click()
    with open(info.value.path(), newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    pasted = [(r["phase"], r["tok_per_s"], r["context_length"], r["build"]) for r in rows
              if r["file_name"] == "pasted text 1"]
    assert pasted == [("prefill", "5765.41", "512", "qwen2 1.5B Q4_0"), ("decode", "197.71", "128", "qwen2 1.5B Q4_0")]
    assert sum(r["file_name"] == "writeup_device_logs.csv" for r in rows) == 6
    assert page.get_by_text("0 error(s)").count() >= 1  # warnings only (no device in the table), no error

    page.wait_for_url(re.compile(r"[?&]logs=[0-9a-f]{32}"))  # the session's logs are kept on the server
    settle(page)
    page.reload()
    page.get_by_text("7 decode, 1 prefill and 0 mixed run(s)").first.wait_for()  # a reload keeps the paste
    page.get_by_role("button", name="Remove the example").click()
    page.get_by_text("1 decode, 1 prefill and 0 mixed run(s)").first.wait_for()
    settle(page)
    page.reload()
    page.get_by_text("1 decode, 1 prefill and 0 mixed run(s)").first.wait_for()  # and the example's removal
    page.get_by_role("button", name="Show the example again").wait_for()
    assert_no_crash(page)
