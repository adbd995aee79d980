"""Issue #20: fold what people ship. Each converter's style (tests/shipped_styles.py: tiny ``mb.program`` steps saved
with plain coremltools) is inspected, folded and proved with no input spec, through the same code the CLI runs:

- inspect counts the KV copies at the stated shape (flexible packages: query length at its lower bound, context at
  its upper bound) and never a sequence-axis tile or a mask;
- fold leaves 0 KV-replication tiles and 0 replication bytes, every stored weight identical;
- the proof runs 4 steps on drawn inputs and is bit-identical (the README's claim), for LUT4 and int4 weights too;
- the walker's tile kinds and the pass's verdicts agree tile by tile (one classifier);
- unified-state styles number their layers; conv-1×1 projections and attention matmuls are in their FLOP categories.
tests/test_fold_shipped_cli.py runs the same packages through every command.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyzer.analysis.record import load_analyses, load_analysis
from analyzer.analysis.shapes import read_sized
from analyzer.cli import main
from analyzer.fold.coreml.package import fold_package
from analyzer.fold.proof import prove_fold
from analyzer.ir.coreml.mil_reader import read_program
from tests.conftest import FOLD_REPORT_KEYS
from tests.shipped_styles import (
    EMAX,
    HKV,
    HQ,
    PREFILL,
    PREFILL_S,
    QMAX,
    STYLES,
    D,
    G,
    H,
    L,
    S,
    anemll_multifunction,
    compress,
)

KV_TILES = {"coreml_llm": 4, "llama_recipe": 4, "hf_sdpa": 4, "anemll_prefill": 4}
OTHER_TILES = {"coreml_llm": 4, "llama_recipe": 0, "hf_sdpa": 0, "anemll_prefill": 0}  # k.expand_as: seq axis


@pytest.fixture(scope="module")
def shipped(shipped_styles):
    """Each style saved, folded (fold_package) and proved (prove_fold, no input spec): conftest, made once."""
    return shipped_styles


@pytest.mark.parametrize("style", list(STYLES))
def test_inspect_counts_the_kv_copies_at_the_stated_shape(shipped, style):
    src, *_ = shipped[style]
    a = load_analysis(src)
    kinds = [t.kind for t in a.summary.tiles]
    assert kinds.count("kv_replication") == KV_TILES[style] and kinds.count("other") == OTHER_TILES[style]
    replicated = [t for t in a.summary.tiles if t.kind == "kv_replication"]
    assert all(t.output_bytes for t in replicated), "a KV copy counted as unsized"
    assert a.account.totals()["replication"] == 2 * sum(t.output_bytes for t in replicated)  # written + read
    assert not a.account.unsized
    if style in ("llama_recipe", "hf_sdpa"):  # flexible: decode at the full visible context
        assumed = {x.name: x.shape for x in a.program.assumed_shapes}
        assert assumed == {"inputIds": (1, 1), "causalMask": (1, 1, 1, EMAX)}
        assert replicated[0].output_shape == (1, HKV, G, EMAX, D)
    assert a.call.phase == ("prefill" if style == "anemll_prefill" else "decode")


@pytest.mark.parametrize("style", list(STYLES))
def test_fold_leaves_no_replication_with_weights_unchanged(shipped, style):
    _, dst, report, _ = shipped[style]
    assert report.tiles_folded == KV_TILES[style] and len(report.tiles_left) == OTHER_TILES[style]
    assert all(not d.replication for d in report.tiles_left)  # only the sequence-axis tiles stay
    (f,) = report.functions
    assert (f.kv_replication_tiles_before, f.kv_replication_tiles_after) == (KV_TILES[style], 0)
    assert f.before["replication"] > 0 and f.after["replication"] == 0
    assert report.weights is not None and report.weights.ok and not report.weights.removed
    assert report.weights.identical == report.weights.checked
    after = load_analysis(dst)
    assert [t.kind for t in after.summary.tiles].count("kv_replication") == 0


@pytest.mark.parametrize("style", list(STYLES))
def test_proof_without_an_input_spec(shipped, style):
    *_, proof = shipped[style]
    assert proof.checked, proof.reason
    assert proof.steps == 4 and proof.roles.startswith("random draws") and proof.draws
    assert proof.bit_identical, proof.max_abs_diff  # the README's claim: every style, bit for bit, over 4 steps
    assert proof.headline().startswith("bit-identical over 4 steps")


def test_walker_and_pass_agree_tile_by_tile(shipped):
    for src, _, report, _ in shipped.values():
        walked = {t.name: t.tile_kind == "kv_replication" for t in read_sized(src).tiles()}
        assert {d.name: d.replication for d in report.decisions} == walked


def test_k_read_transposed_and_merged_transposes_fold(shipped):
    """CoreML-LLM: matmul(x=q, transpose_x=True, y=transpose(perm [1,0,-1,-2]) of a repeat_interleave chain)."""
    _, dst, report, proof = shipped["coreml_llm"]
    folded = [d for d in report.decisions if d.folded]
    assert {d.mapping for d in folded} == {"h // G"} and all("transpose" in d.chain for d in folded)
    assert proof.bit_identical
    assert max(len(t.shape) for op in load_analysis(dst).program.ops for t in op.outputs) <= 4


def test_sequence_axis_tile_is_left_alone_and_not_counted(shipped):
    src, _, report, _ = shipped["coreml_llm"]
    seq = [d for d in report.decisions if not d.folded]
    assert len(seq) == 4 and all("not an attention matmul" in d.reason for d in seq)
    tiles = {t.name: t for t in load_analysis(src).summary.tiles}
    assert all(tiles[d.name].kind == "other" for d in seq)


def test_fused_sdpa_folds_to_q_folded_inputs(shipped):
    _, dst, report, proof = shipped["hf_sdpa"]
    assert report.tiles_folded == 4 and proof.bit_identical
    ops = read_program(dst).ops
    sdpa = [op for op in ops if op.type == "scaled_dot_product_attention"]
    assert len(sdpa) == 2
    for op in sdpa:
        shapes = {r.param: r.tensor.shape for r in op.inputs}
        assert shapes["key"][1] == HKV and shapes["value"][1] == HKV and shapes["query"][1] == HKV  # Q folded
        assert len(shapes["attn_mask"]) <= 4


def test_flexible_shapes_are_folded_and_proved_at_any_given_shape(shipped, tmp_path):
    src, dst, _, _ = shipped["llama_recipe"]
    shapes = {"inputIds": (1, QMAX), "causalMask": (1, 1, QMAX, EMAX)}
    proof = prove_fold(src, dst, steps=4, shapes=shapes)
    assert proof.checked and proof.bit_identical and any("given" in s for s in proof.shapes)
    a = load_analysis(src, shapes=shapes)
    assert a.call.phase == "prefill" and a.call.tokens_per_call == QMAX  # per-call figures for QMAX tokens


def test_prefill_of_hidden_states_is_prefill(shipped):
    src, *_ = shipped["anemll_prefill"]
    call = load_analysis(src).call
    assert (call.phase, call.tokens_per_call) == ("prefill", PREFILL) and "hidden states" in call.how
    assert "per call ÷" in call.per_token_label


def test_multifunction_infer_and_prefill_fold_and_prove(tmp_path):
    """ANEMLL's infer + prefill functions in one package: both folded, both proved (names read function/...)."""
    src = anemll_multifunction(tmp_path / "anemll.mlpackage")
    report = fold_package(src, tmp_path / "folded.mlpackage")
    assert {f.function: (f.kv_replication_tiles_before, f.kv_replication_tiles_after) for f in report.functions} \
        == {"infer": (4, 0), "prefill": (4, 0)}
    assert report.weights.ok and report.weights.identical == report.weights.checked
    proof = prove_fold(src, tmp_path / "folded.mlpackage", steps=4)
    assert proof.checked and proof.bit_identical and {n.split("/")[0] for n in proof.max_abs_diff} == {
        "infer", "prefill"}
    calls = {a.function: (a.call.phase, a.call.tokens_per_call) for a in load_analyses(src)}
    assert calls == {"infer": ("decode", 1), "prefill": ("prefill", PREFILL)}


def test_cli_runs_without_traceback(shipped, tmp_path, capsys):
    src, dst, _, _ = shipped["hf_sdpa"]
    assert main(["inspect", str(src), "--json", "--shape", "inputIds=1,2", "--shape", "causalMask=1,1,2,8"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [x["shape"] for x in doc["assumed_shapes"]] == [[1, 2], [1, 1, 2, 8]]
    assert main(["inspect", str(src), "--shape", "nope=1"]) == 1
    assert "no package given has an input 'nope'" in capsys.readouterr().err
    assert main(["inspect", str(src), "--shape", "causalMask=1,1,9,9"]) == 1
    assert "outside what input 'causalMask' accepts" in capsys.readouterr().err
    out = tmp_path / "cli.mlpackage"
    assert main(["fold", str(src), str(out), "--json", "--builds-dir", str(tmp_path / "b")]) == 0
    doc = json.loads(capsys.readouterr().out)  # strict JSON: no symbolic value anywhere
    assert doc["tiles_folded"] == 4 and doc["proof"]["bit_identical"] and doc["proof"]["draws"]
    assert set(doc) == {"input", "output", "cache", *FOLD_REPORT_KEYS, "proof", "output_written"} and \
        doc["backend"] == "coreml"
    ins = tmp_path / "in.npz"
    np.savez(ins, inputIds=np.array([[1, 2, 3]], dtype=np.int32), causalMask=np.zeros((1, 1, 3, 6), np.float16))
    for pkg, name in ((src, "a.npz"), (dst, "b.npz")):
        assert main(["run", str(pkg), "--inputs", str(ins), "--out", str(tmp_path / name)]) == 0
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert all(np.array_equal(a[k], b[k]) for k in a.files)


# ------------------------------------------------------------------------------------------------ compressed
@pytest.mark.parametrize("style, how, constexpr", [("anemll_prefill", "lut4", "constexpr_lut_to_dense"),
                                                   ("coreml_llm", "int4", "constexpr_blockwise_shift_scale")])
def test_compressed_packages_fold_with_weights_unchanged(shipped, style, how, constexpr, tmp_path):
    """ANEMLL's LUT4 and CoreML-LLM's int4 packages: the fold leaves no KV replication, every stored weight (the
    LUTs, indices and scales too) keeps its bytes (sha256 per constant), and the proof holds."""
    src = compress(shipped[style][0], tmp_path / f"{style}-{how}.mlpackage", how)
    before = load_analysis(src)
    assert [op.type for op in before.program.ops].count(constexpr) >= 8  # q, k, v, o of both layers at least
    report = fold_package(src, tmp_path / "folded.mlpackage")
    (f,) = report.functions
    assert report.tiles_folded == KV_TILES[style] and f.kv_replication_tiles_after == 0 and f.after["replication"] == 0
    assert report.weights.ok and not report.weights.removed and not report.weights.changed
    assert report.weights.identical == report.weights.checked >= 16  # 8 projections × (LUT + indices | data + scale)
    after = load_analysis(tmp_path / "folded.mlpackage")
    assert [op.type for op in after.program.ops].count(constexpr) == [op.type for op in before.program.ops].count(
        constexpr)
    assert after.bytes_per_token.get("weights") == before.bytes_per_token.get("weights")  # compressed, as stored
    proof = prove_fold(src, tmp_path / "folded.mlpackage", steps=4)
    assert proof.checked and proof.bit_identical, proof.headline()


# ------------------------------------------------------------------------------------------------ layers, FLOPs
def test_unified_state_styles_number_their_layers_and_count_flops_by_category(shipped):
    """One KV state sliced per layer and no layer number in any name (CoreML-LLM, ANEMLL): tiles and ops are
    numbered by the order of the attention blocks; CoreML-LLM's conv-1×1 projections are projection FLOPs, ANEMLL's
    attention matmuls are attention scores and values."""
    llm = load_analysis(shipped["coreml_llm"][0])
    assert [t.layer for t in llm.summary.tiles] == [0] * 4 + [1] * 4  # 2 sequence-axis + 2 KV tiles per layer
    assert {r.layer: r.replication > 0 for r in llm.bytes_by_layer} == {0: True, 1: True, None: False}
    rows = llm.flops.op_rows()
    convs = [r for r in rows if r["type"] == "conv"]
    assert len(convs) == 8 and all(r["projections"] == r["total"] > 0 for r in convs)  # q, k, v, o × 2 layers
    assert sorted(r["layer"] for r in convs) == [0] * 4 + [1] * 4
    per_call = llm.flops.per_call()
    assert per_call.get("projections") == L * 2 * H * (HQ * D + 2 * HKV * D + HQ * D)  # 12,288
    assert per_call.get("attention_scores") == per_call.get("attention_values") == L * 2 * HQ * S * D

    anemll = load_analysis(shipped["anemll_prefill"][0])
    assert [t.layer for t in anemll.summary.tiles] == [0, 0, 1, 1]
    matmuls = [r for r in anemll.flops.op_rows() if r["type"] == "matmul"]
    per_head_call = 2 * HQ * PREFILL * PREFILL_S * D  # 64 rows over the whole cache
    assert [(r["layer"], r["attention_scores"], r["attention_values"]) for r in matmuls] == [
        (0, per_head_call, 0), (0, 0, per_head_call), (1, per_head_call, 0), (1, 0, per_head_call)]
    assert all(r["other"] == 0 for r in matmuls)
