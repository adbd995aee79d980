"""Issue #37 on packages made the way people make them (tests/converted_styles.py, built once: conftest
``converted_corpus``): a tiny random transformers decoder traced and converted by plain coremltools along Apple's
recipe (eager, SDPA) and Hugging Face's export, with ``ct.RangeDim`` or enumerated inputs, fp16 and int4; and one
converted program per way a torch model copies K/V heads.

- ``inspect`` counts 2 KV copies per layer, their bytes at the stated shape, their repeats computed by the program;
- ``fold`` leaves 0 copies and 0 replication bytes, every stored weight unchanged, every flexible input's range kept;
- ``run --inputs`` of the original and the folded package agree at the range's lower bound, its default and a shape
  between (bit-identical at query length 1, else max |Δ| ≤ 1e-3 × max |output|), on a cache already holding tokens;
- each replication form (tile with constant or computed repeats, gather, concat, repeat_interleave with a tensor)
  is found and folded where the converter emits it; repeats that depend on a flexible input leave the copy, saying so.

Every command goes through ``analyzer.cli.main`` as the command line does (tests/cli_batch.py's ``run_case``), so
a traceback a user would see fails the test.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from analyzer.analysis.shapes import input_ranges
from analyzer.engines.interpret import load_interpreter
from analyzer.fold.proof import prove_fold
from tests.cli_batch import run_case
from tests.converted_styles import CORE_AI_FORMS, ENUMERATED_Q, FORMS, HKV, HQ, STYLES, D, G, S, call_inputs

PACKAGES = [f"{style}-range-{p}" for style in STYLES for p in ("fp16", "int4")] + \
    [f"{style}-enum-fp16" for style in STYLES] + ["hf_export-enum-int4"]
COPY_BYTES = HQ * S * D * 2  # one fp16 copy of K or V at the stated shape: every query head's cache, S slots
# Under RangeDim inputs the converters' repeats are computed per call; under enumerated shapes coremltools folds
# the HF export's to a constant (the recipe's stay computed)


def expected_reps_from(name: str) -> str:
    return "constant" if name.startswith("hf_export-enum") else "program"


COPY_OP = {"repeat_kv": "tile", "repeat": "tile", "index_select": "gather", "cat": "concat",
           "repeat_interleave_tensor": "tile"}
MAPPING = {"repeat_kv": "h // G", "repeat": "h % Hkv", "index_select": "h // G", "cat": "h % Hkv",
           "repeat_interleave_tensor": "h // G", "gather": "h // G", "getitem": "h // G"}


def cli(*argv) -> dict:
    r = run_case([str(a) for a in argv], {}, timeout_s=120, memory_bytes=4 << 30)
    assert r["traceback"] is None, r["traceback"]
    return r


@pytest.mark.parametrize("name", PACKAGES)
def test_inspect_counts_two_kv_copies_per_layer_at_the_stated_shape(converted_corpus, name):
    src, *_ = converted_corpus[name]
    r = cli("inspect", src, "--json")
    assert r["code"] == 0, r["stderr"]
    doc = json.loads(r["stdout"])
    kv = [t for t in doc["tiles"] if t["kind"] == "kv_replication"]
    assert len(kv) == 4 and len(doc["tiles"]) == 4, doc["tiles"]
    assert Counter(t["layer"] for t in kv) == {0: 2, 1: 2}
    for t in kv:  # [1, Hkv, G, S, D] at the stated shape: the context at its upper bound (or the enumerated S)
        assert t["output_shape"] == [1, HKV, G, S, D] and t["output_bytes"] == COPY_BYTES, t
        assert (t["op_type"], t["reps"]) == ("tile", [1, 1, G, 1, 1]) and t["reps_from"] == expected_reps_from(name), t
        assert t["reason"] == f"copies whole K/V heads for attention: {HQ} query heads read {HKV} KV heads (G = {G})"
    assert doc["bytes_per_token"]["replication"] >= 4 * COPY_BYTES


@pytest.mark.parametrize("name", PACKAGES)
def test_fold_leaves_no_copy_and_keeps_every_weight_and_range(converted_corpus, name):
    src, dst, report = converted_corpus[name]
    assert report.tiles_found == 4 and report.tiles_folded == 4, [(d.name, d.reason) for d in report.decisions]
    assert [(d.reps, d.reps_from, d.mapping) for d in report.decisions] == [((1, 1, G, 1, 1), expected_reps_from(name),
                                                                               "h // G")] * 4
    (f,) = report.functions
    assert (f.kv_replication_tiles_before, f.kv_replication_tiles_after) == (4, 0)
    assert f.before["replication"] > 0 and f.after["replication"] == 0
    assert report.weights is not None and report.weights.ok and not report.weights.removed
    assert report.weights.identical == report.weights.checked > 0
    assert input_ranges(dst) == input_ranges(src)  # every flexible input keeps its range (or enumerated shapes)
    r = cli("inspect", dst, "--json")
    doc = json.loads(r["stdout"])
    assert r["code"] == 0 and doc["bytes_per_token"]["replication"] == 0
    assert not [t for t in doc["tiles"] if t["kind"] == "kv_replication"]


def _shapes(name: str) -> list[tuple[str, int, int]]:
    """(what, query length, visible context) of the calls compared: the range's lower bound, its default and one
    between; for enumerated inputs, each enumerated shape (the lower bound and the default are the first)."""
    if "-enum-" in name:
        return [(f"enumerated q={q}", q, S) for q in ENUMERATED_Q]
    return [("lower bound", 1, 1), ("default", 1, 1), ("between", 3, 9)]


@pytest.mark.parametrize("name", PACKAGES)
def test_run_inputs_of_original_and_folded_agree_over_the_range(converted_corpus, name, tmp_path):
    src, dst, _ = converted_corpus[name]
    ranges = {r.name: r for r in input_ranges(src)}
    assert ranges["inputIds"].default == (1, 1)  # the converters' default: one token, as the recipe's RangeDim
    rng = np.random.default_rng(3)
    cache = {t.name: (rng.standard_normal(t.shape) * 0.5).astype(np.float16) for t in load_interpreter(src).states}
    np.savez(tmp_path / "states.npz", **cache)  # a cache already holding earlier tokens
    for what, q, end in _shapes(name):
        np.savez(tmp_path / "in.npz", **call_inputs(q, end, seed=q))
        outs = []
        for pkg in (src, dst):
            out = tmp_path / f"{pkg.name}-{q}-{end}.npz"
            r = cli("run", pkg, "--inputs", tmp_path / "in.npz", "--states", tmp_path / "states.npz", "--out", out)
            assert r["code"] == 0, (what, r["stderr"])
            outs.append(np.load(out))
        a, b = outs
        assert set(a.files) == set(b.files) >= {"logits", "keyCache", "valueCache"}
        for k in a.files:
            x, y = a[k].astype(np.float32), b[k].astype(np.float32)
            if q == 1:
                assert np.array_equal(x, y, equal_nan=True), (what, k, float(np.max(np.abs(x - y))))
            else:
                assert float(np.max(np.abs(x - y))) <= 1e-3 * float(np.max(np.abs(x))), (what, k)


# ------------------------------------------------------------------------------------------------ the forms
@pytest.mark.parametrize("form", FORMS)
def test_each_replication_form_is_found_and_folded_where_the_converter_emits_it(converted_corpus, form):
    src, dst, report = converted_corpus[f"form-{form}"]
    doc = json.loads(cli("inspect", src, "--json")["stdout"])
    kinds = [(t["op_type"], t["kind"]) for t in doc["tiles"]]
    assert kinds == [(COPY_OP[form], "kv_replication")] * 2, doc["tiles"]
    want_reps = None if COPY_OP[form] != "tile" else "constant"
    assert all(t["reps_from"] == want_reps and (t["reps"] is None) == (want_reps is None) for t in doc["tiles"])
    assert doc["bytes_per_token"]["replication"] >= 2 * COPY_BYTES  # charged as replication, not activations
    assert [(d.op_type, d.folded, d.mapping) for d in report.decisions] == [(COPY_OP[form], True, MAPPING[form])] * 2
    (f,) = report.functions
    assert f.after["replication"] == 0 and report.weights.ok
    proof = prove_fold(src, dst, steps=2)
    assert proof.checked and proof.bit_identical, proof.max_abs_diff


def test_repeats_that_depend_on_a_flexible_input_leave_the_copy_saying_so(converted_corpus, tmp_path):
    """``k.expand(1, Hkv, q, S, D)``: at q = G the copy is KV replication (inspect counts it, its repeats computed by
    the program), but its repeats are the query length, so over the range the decision does not hold: fold leaves
    both copies, names the input and its range, and exits 0."""
    src, _dst, report = converted_corpus["form-repeats_from_query"]
    shape = ("--shape", "hidden=1,2,32", "--shape", "mask=1,1,2,16")
    doc = json.loads(cli("inspect", src, *shape, "--json")["stdout"])
    assert [(t["kind"], t["reps"], t["reps_from"]) for t in doc["tiles"]] == [
        ("kv_replication", [1, 1, G, 1, 1], "program")] * 2
    assert [(d.replication, d.folded, d.reason) for d in report.decisions] == [
        (True, False, f"tile repeats depend on hidden[1] over 1..{S}")] * 2
    r = cli("fold", src, tmp_path / "f.mlpackage", *shape, "--no-proof")
    assert r["code"] == 0 and f"repeats depend on hidden[1] over 1..{S}" in r["stdout"], r
    assert r["stderr"].count("left in place: tile repeats depend on hidden[1]") == 2, r["stderr"]
    doc = json.loads(cli("fold", src, tmp_path / "j.mlpackage", *shape, "--no-proof", "--json")["stdout"])
    assert [t["reps_proved"] for t in doc["tiles"]] == [False, False]
    r = cli("fold", src, tmp_path / "s.mlpackage", *shape, "--no-proof", "--strict")  # scripts: an error
    assert r["code"] == 1 and "2 KV copies left whose repeats are not one value" in r["stderr"], r
    assert "Traceback" not in r["stderr"] and not (tmp_path / "s.mlpackage").exists()


@pytest.mark.parametrize("form", CORE_AI_FORMS)
def test_core_ai_copies_are_found_by_inspect_and_folded_by_the_rewrite_alike(form, tmp_path):
    """coreai-torch's ``torch.cat([k] * G)`` (a ``coreai.concat`` of one value), ``k.repeat`` (a tile),
    ``k.index_select`` and ``torch.gather`` (a ``gather_along_axis`` whose constant index is as large as the copy) and
    ``k[:, idx]`` (a ``gather_nd``): inspect (the walked records) and the rewrite (the MLIR module) read the same
    facts and ask the same classifier; each copy is charged as replication, and the fold is proven on the Core AI
    runtime (every input drawn: an input spec with no roles)."""
    pytest.importorskip("coreai_torch")
    from tests.converted_styles import CORE_AI_OP, convert_coreai_form

    src = convert_coreai_form(form, tmp_path / f"{form}.aimodel")
    doc = json.loads(cli("inspect", src, "--json")["stdout"])
    kv = [t for t in doc["tiles"] if t["kind"] == "kv_replication"]
    assert [t["op_type"] for t in kv] == [CORE_AI_OP[form]] * 2 and len(doc["tiles"]) == 2, doc["tiles"]
    assert all(t["output_bytes"] == HQ * S * D * 4 for t in kv)  # fp32 [1, Hq, S, D]
    assert doc["bytes_per_token"]["replication"] >= 2 * 2 * HQ * S * D * 4  # written, then read: not activations
    (tmp_path / "spec.json").write_text("{}")
    r = cli("fold", src, tmp_path / "f.aimodel", "--json", "--input-spec", tmp_path / "spec.json")
    assert r["code"] == 0, r["stderr"]
    fold = json.loads(r["stdout"])
    assert fold["tiles_folded"] == 2 and all(t["folded"] and t["replication"] for t in fold["tiles"])
    assert {t["mapping"] for t in fold["tiles"]} == {MAPPING.get(form, "h // G")}
    assert fold["weights"]["identical"] == fold["weights"]["checked"] > 0
    assert fold["proof"]["checked"] and fold["proof"]["bit_identical"], fold["proof"]
    after = json.loads(cli("inspect", tmp_path / "f.aimodel", "--json")["stdout"])
    assert after["bytes_per_token"]["replication"] == 0 and not after["tiles"]
