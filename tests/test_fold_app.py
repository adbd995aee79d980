"""The dashboard's fold flow (AppTest): Builds → "Fold it" on an analysed package → the folded package beside the
original on the A/B page with the MIL interpreter's equivalence, and downloadable from Export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_app import TIMEOUT_S, new_app, open_page, texts


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


# ------------------------------------------------------------------------------------------------ flexible shapes
def test_a_flexible_package_is_analysed_folded_and_drawn_at_the_shapes_given(shipped_styles, builds_root,
                                                                              monkeypatch):
    """Apple's recipe style (flexible token ids and mask): a bad shape is one message in the form (never a crash,
    no command-line flags); a good one is stated in the success, the labels, the A/B caption, the fold (proved at
    it) and the Graph tab."""
    src = str(shipped_styles["llama_recipe"][0].resolve())
    monkeypatch.setenv("QFOLD_DATA_ROOTS", str(Path(src).parent))
    at = open_page("app_pages/builds.py")

    def analyse(shapes: str) -> None:
        at.text_input(key="builds_package_path").input(src)
        at.text_input(key="builds_package_shape_text").input(shapes)
        next(b for b in at.button if b.label == "Analyse").click()
        at.run()
        assert not at.exception, [e.value for e in at.exception]

    for bad, words in (("inputIds=1,x", "inputIds=1,x': expected NAME=D0,D1"),
                       ("causalMask=1,1,9,99", "outside what input 'causalMask' accepts ([1,1,1…4,1…16])"),
                       ("nope=1,2", "no package given has an input 'nope'")):
        analyse(bad)
        errors = texts(at.error)
        assert any(words in e for e in errors) and not any("--" in e for e in errors), errors
        assert src not in at.session_state["builds_packages"]

    analyse("inputIds=1,2; causalMask=1,1,2,8")
    done = " ".join(texts(at.success))
    assert "at inputIds [1,2] (given); causalMask [1,1,2,8] (given)" in done, done
    assert at.session_state["builds_package_shapes"] == {src: {"inputIds": (1, 2), "causalMask": (1, 1, 2, 8)}}
    assert json.loads(at.query_params["shapes"]) == {src: {"inputIds": [1, 2], "causalMask": [1, 1, 2, 8]}}

    at.selectbox(key="builds_fold_pick").set_value(src)
    next(b for b in at.button if b.label == "Fold it").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    done = " ".join(texts(at.success))
    assert "4 of 4 tile ops folded" in done and "bit-identical" in done and "at inputIds [1,2] (given)" in done, done
    folded = at.session_state["builds_packages"][-1]
    assert at.session_state["builds_package_shapes"][folded] == {"inputIds": (1, 2), "causalMask": (1, 1, 2, 8)}

    at.session_state["ab_tab"] = "Graph"
    at.switch_page("app_pages/ab.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["ab_a"] == f"package:{src}"
    assert {m.label: m.value for m in at.metric}["tile ops, A → B"] == "4 → 0"
    captions = " ".join(texts(at.caption))
    for side in "AB":
        assert f"{side}'s flexible inputs analysed at inputIds [1,2] (given); causalMask [1,1,2,8] (given)" in captions
        assert f"{side} is drawn at its flexible inputs' shapes: inputIds [1,2] (given)" in captions, captions
    options = at.selectbox(key="ab_a__widget").options
    assert any(o.endswith(" @ inputIds[1,2] causalMask[1,1,2,8]") for o in options), options


def test_a_link_keeps_a_flexible_package_s_shapes_and_warns_about_a_bad_one(shipped_styles, builds_root,
                                                                             monkeypatch):
    src = str(shipped_styles["llama_recipe"][0].resolve())
    monkeypatch.setenv("QFOLD_DATA_ROOTS", str(Path(src).parent))
    for shapes, label, warning in (
            ({"inputIds": [1, 3], "causalMask": [1, 1, 3, 12]}, " @ inputIds[1,3] causalMask[1,1,3,12]", None),
            ({"causalMask": [1, 1, 9, 99]}, " @ inputIds[1,1] causalMask[1,1,1,16]",  # refused: the defaults
             "outside what input 'causalMask' accepts")):
        at = new_app(TIMEOUT_S)
        at.query_params.update({"pkg": src, "shapes": json.dumps({src: shapes}), "a": f"package:{src}"})
        at.run()
        assert not at.exception, [e.value for e in at.exception]
        assert at.session_state["ab_a"] == f"package:{src}"
        packages = [o for o in at.selectbox(key="ab_a__widget").options if o.startswith("llama_recipe.mlpackage")]
        assert len(packages) == 1 and packages[0].endswith(label), packages
        warnings = " ".join(texts(at.warning))
        assert (warning in warnings) if warning else "shapes of" not in warnings, warnings
