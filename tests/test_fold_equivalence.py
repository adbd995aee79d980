"""Equivalence records say what was checked and on which weights (issue #9, part 5): no conversions here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from analyzer.analysis.buildinfo import CHECK_KINDS, EquivalenceCheck
from analyzer.convert.checks import torch_check
from analyzer.jsonfields import Field
from analyzer.report import headline
from tests.synthetic import build_info, decode_analysis


def compressed(a, spec: str = "ffn=pal4"):
    return replace(a, build=replace(a.build, spec=replace(a.build.spec, compression=spec)))


def test_compressed_pair_does_not_borrow_the_torch_bit_identity():
    a, b = compressed(decode_analysis("repeat_kv")), compressed(decode_analysis("qfold"))
    eq = headline.equivalence_summary(a, b)
    assert eq is not None and eq.fp16_bit_identical is None  # the torch pair ran on uncompressed weights
    text = headline.equivalence_text(eq)
    assert "bit-identical" not in text and "uncompressed torch weights" in text and "ffn=pal4" in text
    plain = headline.equivalence_summary(decode_analysis("repeat_kv"), decode_analysis("qfold"))
    assert plain.fp16_bit_identical and "bit-identical" in headline.equivalence_text(plain)


def test_torch_check_names_its_weights():
    info = build_info("repeat_kv", 2)
    check = torch_check(info.equivalence, info.spec)
    assert check.kind == "torch_variants" and check.label == CHECK_KINDS["torch_variants"]
    assert check.bit_identical and check.covers_package_weights and "uncompressed" in check.weights
    squeezed = torch_check(info.equivalence, replace(info.spec, compression="ffn=pal4"))
    assert not squeezed.covers_package_weights and "ffn=pal4" in squeezed.note


def test_checks_survive_the_analysis_file():
    check = EquivalenceCheck("interpreter_vs_torch", "package vs torch", "fp16", 4, True, max_abs_diff=0.004,
                             max_abs_value=3.1, bit_identical=False, greedy_agree_steps=4)
    info = replace(build_info("qfold", 2), checks=(check,))
    doc = info.to_json()
    assert doc["equivalence"]["checks"][0]["label"] == "MIL interpreter vs torch"
    again = type(info).from_json(Field(doc, "<doc>"), ())
    assert again.checks == (check,) and again.check("interpreter_vs_torch") == check


def test_fold_pair_shows_the_interpreter_proof():
    original = decode_analysis("repeat_kv")
    proof = EquivalenceCheck("folded_vs_original", "folded vs original", "stored", 4, True, max_abs_diff=0.0,
                             max_abs_value=3.0, bit_identical=True)
    folded = decode_analysis("qfold")
    folded = replace(folded, build=replace(folded.build, key="synthetic-fold", checks=(proof,),
                                           spec=replace(folded.build.spec, variant="repeat_kv+fold"),
                                           extra={"folded_from": original.build.key}))
    eq = headline.equivalence_summary(original, folded)
    assert eq is not None and eq.checked == "MIL interpreter, folded vs original" and eq.fp16_bit_identical
    assert headline.equivalence_summary(folded, original).variant_a == "repeat_kv+fold"


def test_unknown_check_kind_is_refused():
    with pytest.raises(ValueError, match="check kind"):
        EquivalenceCheck("predict", "x", "y", 1, True)
