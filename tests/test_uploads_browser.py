"""Every page's uploads get the bad-input corpus's number cases (tests/bad_input_cases.py: an integer of 5,000
digits, past Python's 4,300-digit ``int()`` limit; NaN and a float past 1e308) in a real browser: each is refused
with the message the CLI gives for the same file, and no page shows Streamlit's error screen. The Builds page's
config.json upload crashed on the 5,000-digit vocab_size ("This app has encountered an error") while the CLI refused
it cleanly (issue #39)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.bad_input_cases import BIG_INT
from tests.test_browser import REPO, assert_no_crash, settle, upload

pytestmark = pytest.mark.browser
PRESET = REPO / "analyzer" / "model" / "presets" / "llama-3.2-1b.json"
DIGITS = "an integer of 5,000 digits (more than the 32 accepted)"  # fsio.IntegerTooLongError, everywhere


def config(tmp_path: Path, name: str, old: str, new: str) -> Path:
    text = json.dumps(json.loads(PRESET.read_text()))
    assert text.count(old) == 1
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(text.replace(old, new))
    return path / "config.json"


@pytest.mark.parametrize(("old", "new", "message"), [  # the CLI's own tests hold every case; the page: QFOLD_EXTENDED=1
    ('"vocab_size": 128256', f'"vocab_size": {BIG_INT}', f"config.json: {DIGITS}"),
    pytest.param('"rope_theta": 500000.0', '"rope_theta": NaN', "config.json: field rope_theta is NaN; only finite "
                 "numbers", marks=pytest.mark.extended),
    pytest.param('"rope_theta": 500000.0', '"rope_theta": 1e999', "config.json: field rope_theta is 1e999… (too large "
                 "for a float); only finite numbers", marks=pytest.mark.extended),
], ids=["integer-of-5000-digits", "nan", "float-past-1e308"])
def test_the_builds_pages_config_upload_refuses_what_the_cli_refuses_with_its_message(page, server, tmp_path, capsys,
                                                                                     old, new, message):
    from analyzer.cli import main

    path = config(tmp_path, "c", old, new)
    assert main(["build", "--model", str(path), "--variant", "qfold"]) == 1
    cli = capsys.readouterr().err.strip()
    assert cli == f"error: {path.parent}/{message}" or cli.startswith(f"error: {path.parent}/{message}"), cli
    page.goto(f"{server}/builds")
    page.get_by_text("Upload config.json").first.click()
    upload(page, str(path))
    page.get_by_text(message).first.wait_for()
    settle(page)
    assert_no_crash(page)


def test_the_other_pages_uploads_refuse_a_5000_digit_integer_with_the_clis_message(page, server, tmp_path):
    log = tmp_path / "int.json.log"  # the corpus's fit case: llama-bench JSON with a 5,000-digit n_gen
    log.write_text('[{"build_commit": "x", "model_type": "m", "n_prompt": 0, "n_gen": ' + BIG_INT + ', "avg_ts": 1}]')
    blob = tmp_path / "bench.json"  # the community Core AI blob this issue reads
    blob.write_text((REPO / "tests" / "data" / "logs" / "coreai_community_pb_random.json").read_text()
                    .replace('"prompt_tokens" : 128', '"prompt_tokens" : ' + BIG_INT))
    page.goto(f"{server}/device_logs")
    upload(page, [str(log), str(blob)])
    page.get_by_text(re.compile(r"int\.json\.log was rejected as a whole: .*invalid JSON: " + re.escape(DIGITS)))\
        .first.wait_for()
    page.get_by_text(re.compile(r"bench\.json was rejected as a whole: .*invalid JSON: " + re.escape(DIGITS)))\
        .first.wait_for()
    settle(page)
    assert_no_crash(page)

    spec = tmp_path / "int.json"  # the corpus's sweep case: a spec whose ctx has 5,000 digits
    spec.write_text('{"ctx": [' + BIG_INT + "]}")
    page.goto(f"{server}/sweeps")
    page.locator('.st-key-sweeps_spec [data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(spec))
    page.get_by_role("button", name="Run the sweep").click()
    page.get_by_text(re.compile(r"spec\.json: " + re.escape(DIGITS))).first.wait_for()
    assert_no_crash(page)
    table = tmp_path / "table.json"
    table.write_text('[{"ctx": ' + BIG_INT + "}]")
    page.get_by_text("load a table").first.click()
    page.locator('.st-key-sweeps_table [data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(table))
    page.get_by_text("table.json: cannot read the sweep table").first.wait_for()
    settle(page)
    assert_no_crash(page)

    plan = tmp_path / "plan.json"  # a compute plan whose cost has 5,000 digits, on the A/B page's Placement tab
    plan.write_text((REPO / "tests" / "data" / "placement" / "compute_plan_small.json").read_text()
                    .replace('"cost": 0.0068', '"cost": ' + BIG_INT, 1))
    page.goto(server)
    page.get_by_role("tab", name="Placement").click()
    page.locator('.st-key-ab_plan_upload_A [data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(plan))
    page.get_by_text(re.compile(re.escape(DIGITS))).first.wait_for()
    settle(page)
    assert_no_crash(page)
