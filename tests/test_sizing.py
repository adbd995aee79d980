"""No silent zero (issue 37, item 4): a program the interpreter cannot size at its assumed shapes, or a copy op
without a size or a verdict, is said to be so wherever its figures are shown — a warning on stderr naming the op
and the cause, ``sized: false`` (and why) in ``--json``, the unsized copies beside the tile count, "could not be
sized" in the A/B headline — and ``--strict`` makes it an error (exit 1). Storing it is analysis.json schema 3.

The package that cannot be sized is made as other tools make packages (``tests.traced_steps``: a torch step with
transformers' ``repeat_kv``, traced and converted with plain ``ct.convert`` at a ``ct.RangeDim`` sequence length)
and holds an op the interpreter has no kernel for (MIL ``avg_pool``), so it stays unsized whatever the interpreter
learns about shape arithmetic. Its static twin (the same module at a fixed length) needs no interpreter to be
sized."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pandas as pd
import pytest

from analyzer.analysis.record import (
    SCHEMA_VERSION,
    analysis_from_json,
    load_analysis,
    read_analysis_file,
    write_analysis,
)
from analyzer.cli import main
from analyzer.report.headline import NOT_SIZED, ab_headline, headline_cards, headline_frame
from tests.traced_steps import convert_gqa_step

pytestmark = pytest.mark.conversion

@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    """(flexible: cannot be sized, static: sized, multi: both as functions ``flex`` (default) and ``fixed``)."""
    import coremltools as ct

    root = tmp_path_factory.mktemp("sizing")
    flex = convert_gqa_step(root / "flex.mlpackage", flexible=True, pool=True)
    fixed = convert_gqa_step(root / "fixed.mlpackage", flexible=False, pool=True)
    desc = ct.utils.MultiFunctionDescriptor()
    desc.add_function(flex, "main", "flex")
    desc.add_function(fixed, "main", "fixed")
    desc.default_function_name = "flex"
    ct.utils.save_multifunction(desc, str(root / "multi.mlpackage"))
    return flex, fixed, str(root / "multi.mlpackage")


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    return code, out.out, out.err


CAUSE = "has type 'avg_pool', which the MIL interpreter does not implement"


def test_the_package_cannot_be_sized_and_its_copies_have_no_size_nor_verdict(packages):
    flex, fixed = load_analysis(packages[0]), load_analysis(packages[1])
    assert flex.program.sizing_error is not None and CAUSE in flex.program.sizing_error
    assert "hidden_states[1,1,32]" in flex.program.sizing_error  # the shapes it was tried at
    assert [a.how for a in flex.program.assumed_shapes] == ["query length at its lower bound"]  # the rule alone
    tiles = flex.summary.tiles
    assert len(tiles) == 2 and all(t.unsized for t in tiles) and flex.summary.unsized_copies == 2
    assert not flex.sizing.sized and flex.sizing.unsized_reason.startswith("not sized: the MIL interpreter")
    assert [c.name for c in flex.sizing.unsized_copies] == [t.name for t in tiles]
    # the static twin: sized, its two copies of K and V with a size and a verdict
    assert fixed.sizing.sized and fixed.sizing.reasons == () and fixed.program.sizing_error is None
    assert [t.kind for t in fixed.summary.tiles] == ["kv_replication"] * 2 and fixed.summary.unsized_copies == 0
    assert fixed.bytes_per_token.replication > 0


def test_inspect_warns_naming_the_op_and_the_cause_and_strict_makes_it_an_error(packages, capsys):
    flex = packages[0]
    code, out, err = _cli(capsys, "inspect", flex)
    assert code == 0
    warnings = [line for line in err.splitlines() if line.startswith(f"warning: {flex}: ")]
    assert warnings and CAUSE in warnings[0] and "op '" in warnings[0]
    assert "2 tile ops (2 unsized: no size or no verdict), output could not be sized" in out
    assert "NOT SIZED" in out
    code, out, err = _cli(capsys, "inspect", flex, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["sized"] is False and CAUSE in doc["unsized_reason"]
    assert (doc["tile_count"], doc["unsized_copies"]) == (2, 2)
    assert [t["kind"] for t in doc["tiles"]] == ["unclassified"] * 2
    for argv in (("inspect", flex, "--strict"), ("inspect", flex, "--json", "--strict")):
        code, out, err = _cli(capsys, *argv)
        assert code == 1 and err.strip().splitlines()[-1].startswith(f"error: {flex}: could not be sized")
        assert out  # the report is still written: --strict only makes the exit an error
    code, out, err = _cli(capsys, "inspect", packages[1], "--json", "--strict")
    doc = json.loads(out)
    assert code == 0 and err == "" and (doc["sized"], doc["unsized_reason"], doc["unsized_copies"]) == (True, None, 0)


def test_each_function_of_a_package_says_whether_it_is_sized(packages, capsys):
    multi = packages[2]
    code, out, err = _cli(capsys, "inspect", multi, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["sized"] is False  # the default function, flex
    by_name = {f["function"]: f for f in doc["functions"]}
    assert (by_name["flex"]["sized"], by_name["flex"]["unsized_copies"]) == (False, 2)
    assert (by_name["fixed"]["sized"], by_name["fixed"]["unsized_reason"], by_name["fixed"]["unsized_copies"]) == (
        True, None, 0)
    assert f"warning: {multi} (function flex): not sized" in err and "(function fixed)" not in err
    assert _cli(capsys, "inspect", multi, "--function", "fixed", "--strict")[0] == 0
    assert _cli(capsys, "inspect", multi, "--strict")[0] == 1


def test_diff_and_graph_say_which_side_is_not_sized(packages, capsys, tmp_path):
    flex, fixed = packages[:2]
    code, out, err = _cli(capsys, "diff", flex, fixed, "--json")
    doc = json.loads(out)
    assert code == 0 and doc["sized"] == {"a": False, "b": True} and doc["unsized_copies"] == {"a": 2, "b": 0}
    assert CAUSE in doc["unsized_reason"]["a"] and doc["unsized_reason"]["b"] is None
    assert f"warning: A {flex}: not sized" in err
    code, out, err = _cli(capsys, "diff", flex, fixed)
    assert "tiles: 2 (2 unsized) → 2; tile output removed: could not be sized" in out and "NOT SIZED: A" in out
    assert _cli(capsys, "diff", fixed, fixed, "--strict")[0] == 0
    code, _, err = _cli(capsys, "diff", fixed, flex, "--strict")
    assert code == 1 and f"error: B {flex}: could not be sized" in err
    code, out, err = _cli(capsys, "graph", flex, fixed, "--out", str(tmp_path / "g.dot"))
    assert code == 0 and f"warning: A {flex}: not sized" in err and "(NOT SIZED)" in (tmp_path / "g.dot").read_text()
    code, out, err = _cli(capsys, "graph", flex, "--out", str(tmp_path / "s.dot"), "--strict")
    assert code == 1 and not (tmp_path / "s.dot").exists()


def test_fold_says_sized_per_function_and_never_that_undecided_copies_are_not_kv(packages, capsys, tmp_path):
    flex = packages[0]
    builds = str(tmp_path / "builds")
    code, out, err = _cli(capsys, "fold", flex, str(tmp_path / "f.mlpackage"), "--json", "--builds-dir", builds)
    doc = json.loads(out)
    assert code == 0 and [(f["function"], f["sized"]) for f in doc["functions"]] == [("main", False)]
    assert CAUSE in doc["functions"][0]["unsized_reason"] and f"warning: {flex}: not sized" in err
    code, out, err = _cli(capsys, "fold", flex, str(tmp_path / "g.mlpackage"), "--builds-dir", builds)
    assert "whether they copy K/V for attention is unknown (function main could not be sized)" in out
    assert "none copies K/V" not in out
    code, out, err = _cli(capsys, "fold", flex, str(tmp_path / "h.mlpackage"), "--strict", "--builds-dir", builds)
    assert code == 1 and "could not be sized" in err and not (tmp_path / "h.mlpackage").exists()


def test_fit_refuses_an_unsized_analysis_naming_it(packages, capsys, tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("device,build,tok_per_s\nphone,flex,10\nphone,fixed,12\n")
    code, _, err = _cli(capsys, "fit", str(log), "--build", f"flex={packages[0]}", "--build",
                          f"fixed={packages[1]}")
    assert code == 2 and f"--build 'flex={packages[0]}': {packages[0]} could not be sized" in err and CAUSE in err


def test_the_sizing_is_stored_and_schema_2_notes_are_migrated(packages, tmp_path):
    flex = load_analysis(packages[0])
    write_analysis(tmp_path / "a.json", flex)
    doc = json.loads((tmp_path / "a.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION == 3 and doc["program"]["sizing_error"] == flex.program.sizing_error
    assert doc["sizing"]["sized"] is False and doc["summary"]["unsized_copies"] == 2
    back = read_analysis_file(tmp_path / "a.json")
    assert back.program == flex.program and back.sizing == flex.sizing and back.migrated_from is None
    # schema 2 kept the failure in each assumed shape's "how"
    old = copy.deepcopy(doc)
    old["schema_version"] = 2
    why = flex.program.sizing_error.split(": ", 1)[1]
    del old["program"]["sizing_error"]
    for a in old["program"]["assumed_shapes"]:
        a["how"] += f"; not sized: the interpreter cannot run it ({why})"
    migrated = analysis_from_json(old, "old.json")
    assert migrated.migrated_from == 2 and migrated.program.sizing_error == flex.program.sizing_error
    assert migrated.program.assumed_shapes == flex.program.assumed_shapes and not migrated.sizing.sized
    del old["program"]["assumed_shapes"][0]["how"]  # a malformed old file is still refused by field
    with pytest.raises(Exception, match=r"old.json: field program.assumed_shapes\[0\].how: missing"):
        analysis_from_json(old, "old.json")


def test_the_ab_headline_says_could_not_be_sized_instead_of_a_number(packages):
    flex, fixed = load_analysis(packages[0]), load_analysis(packages[1])
    h = ab_headline(flex, fixed, bw_bytes_per_s=60e9)
    cards = {c.key: c for c in headline_cards(h)}
    assert cards["tiles"].value == "2 (2 unsized) → 2"
    for key in ("tile_bytes", "bytes", "tok_per_s"):
        assert cards[key].value.startswith(f"{NOT_SIZED} → ") and cards[key].delta is None, key
        assert CAUSE in cards[key].help
    frame = headline_frame(h).set_index("what")
    assert (frame.loc["sized", "a"], frame.loc["sized", "b"]) == (0, 1)
    assert pd.isna(frame.loc["bytes per token: total", "a"]) and frame.loc["bytes per token: total", "b"] > 0
    same = {c.key: c for c in headline_cards(ab_headline(fixed, fixed, bw_bytes_per_s=60e9))}
    assert NOT_SIZED not in " ".join(c.value for c in same.values())


def test_the_dashboard_says_could_not_be_sized_where_the_figures_are(packages, builds_root, monkeypatch):
    """Builds → analyse the package that cannot be sized: a warning (not a success) with the cause; the A/B page
    against its static twin: "could not be sized" in the byte and speed cards and the cause above them."""
    from tests.test_app import open_page, texts

    flex, fixed = (str(Path(p).resolve()) for p in packages[:2])
    monkeypatch.setenv("QFOLD_DATA_ROOTS", str(Path(flex).parent))
    at = open_page("app_pages/builds.py")
    for package in (fixed, flex):
        at.text_input(key="builds_package_path").input(package)
        next(b for b in at.button if b.label == "Analyse").click()
        at.run()
        assert not at.exception, [e.value for e in at.exception]
    warned = " ".join(texts(at.warning))
    assert "2 tile ops (2 unsized), bytes per call could not be sized" in warned and CAUSE in warned, warned
    at.session_state["ab_a"], at.session_state["ab_b"] = f"package:{flex}", f"package:{fixed}"
    at.switch_page("app_pages/ab.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["tile ops, A → B"] == "2 (2 unsized) → 2"
    assert metrics["bytes per token, A → B"].startswith(f"{NOT_SIZED} → ")
    assert any(v.startswith(f"{NOT_SIZED} → ") for k, v in metrics.items() if k.startswith("predicted tok/s"))
    assert any(t.startswith("A could not be sized: not sized: the MIL interpreter") for t in texts(at.warning))
    at.session_state["ab_tab"] = "Tiles"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("2 tile ops, 2 unsized, output could not be sized" in t for t in texts(at.markdown))
