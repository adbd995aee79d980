"""The dashboard's fold flow (AppTest): Builds → "Fold it" on an analysed package → the folded package beside the
original on the A/B page with the MIL interpreter's equivalence, and downloadable from Export."""

from __future__ import annotations

import pytest

from tests.test_app import open_page, texts


@pytest.fixture(scope="module")
def folded_session(tiny_builds):
    """A session that analysed the tiny repeat_kv package and folded it from the Builds page."""
    package = str((tiny_builds["repeat_kv"] / "model.mlpackage").resolve())
    at = open_page("app_pages/builds.py", builds_packages=[package])
    at.selectbox(key="builds_fold_pick").set_value(package)
    next(b for b in at.button if b.label == "Fold it").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at, package


def test_fold_it_reports_tiles_bytes_and_proof(folded_session):
    at, package = folded_session
    done = " ".join(texts(at.success))
    assert "4 of 4 tile ops folded" in done and "bit-identical over 4 decode steps" in done, done
    packages = at.session_state["builds_packages"]
    assert packages[0] == package and packages[1].endswith("model.mlpackage") and "/.folds/" in packages[1]


def test_ab_shows_the_fold_beside_the_original_with_the_interpreter_check(folded_session):
    at, _ = folded_session
    at.switch_page("app_pages/ab.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["tile ops, A → B"] == "4 → 0"
    eq = " ".join(texts(at.success))
    assert "MIL interpreter, folded vs original" in eq and "bit-identical" in eq, eq


def test_export_offers_the_folded_package(folded_session):
    at, _ = folded_session
    at.session_state["export_ref"] = at.session_state["ab_b"]
    at.switch_page("app_pages/export.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("/.folds/" in t for t in texts(at.markdown)), texts(at.markdown)
