"""Equivalence records say what was checked and on which weights (issue #9, part 5): no conversions here."""

from __future__ import annotations

import pytest

from analyzer.build.equivalence import CHECK_KINDS, EquivalenceCheck, torch_check
from analyzer.report import report
from tests.test_figures import make_doc
from tests.test_report import with_spec


def compressed(doc: dict, spec: str = "ffn=pal4") -> dict:
    doc["spec"] = {**doc["spec"], "compression": spec}
    return doc


def test_compressed_pair_does_not_borrow_the_torch_bit_identity():
    a = compressed(with_spec(make_doc(tiles=4), "repeat_kv"))
    b = compressed(with_spec(make_doc(tiles=0), "qfold"))
    eq = report.equivalence_summary(a, b)
    assert eq is not None and eq.fp16_bit_identical is None  # the torch pair ran on uncompressed weights
    text = report.equivalence_text(eq)
    assert "bit-identical" not in text and "uncompressed torch weights" in text and "ffn=pal4" in text
    plain = report.equivalence_summary(with_spec(make_doc(tiles=4), "repeat_kv"),
                                       with_spec(make_doc(tiles=0), "qfold"))
    assert plain.fp16_bit_identical and "bit-identical" in report.equivalence_text(plain)


def test_torch_check_names_its_weights():
    doc = with_spec(make_doc(tiles=4), "repeat_kv")
    check = torch_check(doc["equivalence"], doc["spec"])
    assert check["kind"] == "torch_variants" and check["label"] == CHECK_KINDS["torch_variants"]
    assert check["bit_identical"] and check["covers_package_weights"] and "uncompressed" in check["weights"]
    squeezed = torch_check(doc["equivalence"], compressed(doc)["spec"])
    assert not squeezed["covers_package_weights"] and "ffn=pal4" in squeezed["note"]


def test_fold_pair_shows_the_interpreter_proof():
    original = with_spec(make_doc(tiles=4), "repeat_kv")
    original["key"] = "m-repeat_kv-state-ctx4096-abc"
    folded = with_spec(make_doc(tiles=0), "repeat_kv+fold")
    folded["folded_from"] = original["key"]
    folded["equivalence"] = {**folded["equivalence"], "checks": [EquivalenceCheck(
        "folded_vs_original", "folded vs original", "stored", 4, True, max_abs_diff=0.0, max_abs_value=3.0,
        bit_identical=True).to_json()]}
    eq = report.equivalence_summary(original, folded)
    assert eq is not None and eq.checked == "MIL interpreter, folded vs original" and eq.fp16_bit_identical
    assert report.equivalence_summary(folded, original).variant_a == "repeat_kv+fold"


def test_unknown_check_kind_is_refused():
    with pytest.raises(ValueError, match="check kind"):
        EquivalenceCheck("predict", "x", "y", 1, True)
