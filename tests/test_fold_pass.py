"""``qfold::fold_gqa_replication`` on hand-built MIL programs, coremltools-pass-test style.

Each case builds a tiny program with ``mb.program``, runs the pass through coremltools'
``apply_pass_and_basic_check`` (a deep copy; outputs keep their names, types and shapes), asserts op counts,
ranks and the per-tile decisions, then saves both programs and runs them in the MIL interpreter on the same
random inputs. Shapes: Hq query heads, Hkv KV heads, G = Hq / Hkv, M query rows, S cache slots, D head dim.
"""

from __future__ import annotations

import itertools
from collections import Counter

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil.mil import Builder as mb
from coremltools.converters.mil.mil import types
from coremltools.converters.mil.mil.passes.pass_pipeline import PassPipeline
from coremltools.converters.mil.mil.passes.pass_registry import PASS_REGISTRY
from coremltools.converters.mil.testing_utils import apply_pass_and_basic_check

from analyzer.engines.interpret import load_interpreter
from analyzer.fold.coreml.gqa_fold import fold_gqa_replication
from analyzer.fold.fold_records import PASS_NAME
from analyzer.ir.replication import HeadMap, head_mapping

IOS18 = ct.target.iOS18
FP16 = types.fp16
S, D = 16, 8


# ------------------------------------------------------------------------------------------------ replication
def repeat_kv(x, g: int):
    """transformers' repeat_kv as coremltools emits it: expand_dims → tile → reshape (h // G)."""
    b, h, s, d = x.shape
    e = mb.expand_dims(x=x, axes=[2])
    t = mb.tile(x=e, reps=[1, 1, g, 1, 1])
    return mb.reshape(x=t, shape=[b, h * g, s, d])


def repeat_heads(x, g: int):
    """``x.repeat(1, G, 1, 1)``: one tile on the head axis (h % Hkv)."""
    return mb.tile(x=x, reps=[1, g, 1, 1])


def repeat_interleave(x, g: int):
    """``torch.repeat_interleave(x, G, dim=1)`` as coremltools' torch frontend lowers it (h // G)."""
    b, h, s, d = x.shape
    t = mb.transpose(x=x, perm=[1, 0, 2, 3])  # [Hkv, B, S, D]
    t = mb.tile(x=t, reps=[g, 1, 1, 1])  # [G·Hkv, B, S, D]
    t = mb.reshape(x=t, shape=[g, h, b, s, d])
    t = mb.transpose(x=t, perm=[1, 0, 2, 3, 4])  # [Hkv, G, B, S, D]
    t = mb.reshape(x=t, shape=[h * g, b, s, d])
    return mb.transpose(x=t, perm=[1, 0, 2, 3])  # [B, Hq, S, D]


def repeat_shuffled(x, g: int):
    """KV heads regrouped [0, 2, 1, 3, ...] (pairs swapped across halves), then ``repeat``: a mapping that is
    neither h // G nor h % Hkv, folded with a gather of Q."""
    b, h, s, d = x.shape
    t = mb.reshape(x=x, shape=[b, 2, h // 2, s, d])
    t = mb.transpose(x=t, perm=[0, 2, 1, 3, 4])
    t = mb.reshape(x=t, shape=[b, h, s, d])
    return mb.tile(x=t, reps=[1, g, 1, 1])


STYLES = {"repeat_kv": repeat_kv, "repeat": repeat_heads, "repeat_interleave": repeat_interleave}
MAPPINGS = {"repeat_kv": "h // G", "repeat": "h % Hkv", "repeat_interleave": "h // G",
            "shuffled": "permutation"}


def attention(q, kr, vr, mask):
    """softmax(q·krᵀ·scale + mask)·vr → [1, M, Hq·D] (the o_proj input)."""
    _, hq, m, d = q.shape
    s = mb.matmul(x=q, y=kr, transpose_y=True)
    s = mb.mul(x=s, y=np.float16(d ** -0.5))
    s = mb.add(x=s, y=mask)
    w = mb.softmax(x=s, axis=-1)
    o = mb.matmul(x=w, y=vr)  # [1, Hq, M, D]
    o = mb.transpose(x=o, perm=[0, 2, 1, 3])
    return mb.reshape(x=o, shape=[1, m, hq * d])


def kv_input_program(style, hq: int, hkv: int, m: int = 1, mask_rows: int = 1):
    g = hq // hkv
    replicate = STYLES.get(style, repeat_shuffled)

    @mb.program(input_specs=[mb.TensorSpec((1, hq, m, D), FP16), mb.TensorSpec((1, hkv, S, D), FP16),
                             mb.TensorSpec((1, hkv, S, D), FP16), mb.TensorSpec((1, 1, mask_rows, S), FP16)],
                opset_version=IOS18)
    def prog(q, k, v, mask):
        return attention(q, replicate(k, g), replicate(v, g), mask)

    return prog


def state_program(hq: int, hkv: int):
    """KV as state, as qfold's builds convert it: read_state → slice_update at pos → coreml_update_state,
    then repeat_kv of the updated cache."""
    g = hq // hkv

    @mb.program(input_specs=[mb.TensorSpec((1, hq, 1, D), FP16), mb.TensorSpec((1, hkv, 1, D), FP16),
                             mb.TensorSpec((1, hkv, 1, D), FP16), mb.TensorSpec((1,), types.int32),
                             mb.TensorSpec((1, 1, 1, S), FP16),
                             mb.StateTensorSpec((1, hkv, S, D), FP16), mb.StateTensorSpec((1, hkv, S, D), FP16)],
                opset_version=IOS18)
    def prog(q, k_new, v_new, pos, mask, k_cache, v_cache):
        zero = np.array([0], dtype=np.int32)
        begin = mb.concat(values=[zero, zero, pos, zero], axis=0)
        end = mb.concat(values=[np.array([1], np.int32), np.array([hkv], np.int32), mb.add(x=pos, y=1),
                                np.array([D], np.int32)], axis=0)
        caches = []
        for cache, new in ((k_cache, k_new), (v_cache, v_new)):
            updated = mb.slice_update(x=mb.read_state(input=cache), update=new, begin=begin, end=end)
            caches.append(mb.coreml_update_state(state=cache, value=updated))
        return attention(q, repeat_kv(caches[0], g), repeat_kv(caches[1], g), mask)

    return prog


def self_term_program(hq: int, hkv: int):
    """qfold's ``--kv input`` attention: the read-only cache plus the token's own k/v in the same softmax,
    ``out = w[..., :S]·V + w[..., S:] * v_new`` (every K/V replicated with repeat_kv)."""
    g = hq // hkv

    @mb.program(input_specs=[mb.TensorSpec((1, hq, 1, D), FP16), mb.TensorSpec((1, hkv, S, D), FP16),
                             mb.TensorSpec((1, hkv, S, D), FP16), mb.TensorSpec((1, hkv, 1, D), FP16),
                             mb.TensorSpec((1, hkv, 1, D), FP16), mb.TensorSpec((1, 1, 1, S), FP16)],
                opset_version=IOS18)
    def prog(q, k, v, k_new, v_new, mask):
        scale = np.float16(D ** -0.5)
        s = mb.add(x=mb.mul(x=mb.matmul(x=q, y=repeat_kv(k, g), transpose_y=True), y=scale), y=mask)
        s_self = mb.mul(x=mb.matmul(x=q, y=repeat_kv(k_new, g), transpose_y=True), y=scale)  # [1, Hq, 1, 1]
        w = mb.softmax(x=mb.concat(values=[s, s_self], axis=-1), axis=-1)  # [1, Hq, 1, S+1]
        w_cache = mb.slice_by_index(x=w, begin=[0, 0, 0, 0], end=[1, hq, 1, S], end_mask=[True, True, True, False])
        w_self = mb.slice_by_index(x=w, begin=[0, 0, 0, S], end=[1, hq, 1, S + 1], end_mask=[True] * 4)
        o = mb.add(x=mb.matmul(x=w_cache, y=repeat_kv(v, g)), y=mb.mul(x=w_self, y=repeat_kv(v_new, g)))
        o = mb.transpose(x=o, perm=[0, 2, 1, 3])
        return mb.reshape(x=o, shape=[1, 1, hq * D])

    return prog


# ------------------------------------------------------------------------------------------------ helpers
def run_fold(prog):
    graph_pass = fold_gqa_replication()
    prev, _, block = apply_pass_and_basic_check(prog, graph_pass)
    return prev, block, graph_pass.decisions


def op_types(block) -> Counter:
    return Counter(op.op_type for op in block.operations if op.op_type != "const")


def max_rank(block) -> int:
    return max(len(o.shape) for op in block.operations for o in op.outputs if o.shape is not None)


def save(prog, path) -> str:
    model = ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=IOS18,
                       pass_pipeline=PassPipeline.EMPTY, skip_model_load=True)
    model.save(str(path))
    return str(path)


def assert_same_numbers(before, after, tmp_path, steps: int = 1, seed: int = 0) -> float:
    """Run both programs in the interpreter on the same seeded inputs (states carried over ``steps``);
    returns the largest |Δ| relative to the largest |output| and asserts it is fp16-small."""
    a = load_interpreter(save(before, tmp_path / "before.mlpackage"))
    b = load_interpreter(save(after, tmp_path / "after.mlpackage"))
    rng = np.random.default_rng(seed)
    states_a = states_b = None
    worst = 0.0
    for step in range(steps):
        feed = {}
        for t in a.inputs:
            if t.dtype.startswith("int"):
                feed[t.name] = np.full(t.shape, step, dtype=np.int32)
            else:
                feed[t.name] = rng.standard_normal(t.shape).astype(np.float16)
        ra, rb = a.run(feed, states_a), b.run(feed, states_b)
        states_a, states_b = ra.states, rb.states
        for name in ra.outputs:
            scale = float(np.abs(ra.outputs[name]).max())
            worst = max(worst, float(np.abs(ra.outputs[name].astype(np.float32) - rb.outputs[name]).max()) / scale)
        for name in ra.states:
            np.testing.assert_array_equal(ra.states[name], rb.states[name])
    assert worst <= 1e-3, f"folded program differs: max |Δ| = {worst:.3g} × max |output|"
    return worst


# ------------------------------------------------------------------------------------------------ tests
def test_registered_in_coremltools():
    assert isinstance(PASS_REGISTRY[PASS_NAME], fold_gqa_replication)
    pipeline = ct.PassPipeline(pass_names=[PASS_NAME, "common::dead_code_elimination"], pipeline_name="fold")
    assert pipeline.passes[0] == PASS_NAME


CASES = [
    *itertools.product(["repeat_kv", "repeat", "repeat_interleave"], [(8, 2)], [1, 3]),  # decode and q_len 3
    *itertools.product(["repeat_kv", "repeat"], [(4, 1)], [1]),  # MQA
    *itertools.product(["shuffled"], [(8, 4)], [1, 3]),  # KV heads [0, 2, 1, 3]: a gather of Q
]


@pytest.mark.parametrize("style, heads, m", CASES)
def test_folds_every_replication_style(style, heads, m, tmp_path):
    hq, hkv = heads
    prog = kv_input_program(style, hq, hkv, m=m, mask_rows=m)
    before_tiles = op_types(prog.functions["main"])["tile"]
    prev, block, decisions = run_fold(prog)
    mapping = "h // G" if hkv == 1 else MAPPINGS[style]  # MQA: every mapping is the plain fold
    assert before_tiles == 2 and len(decisions) == 2
    assert all(d.folded and d.mapping == mapping and d.kv_heads == hkv and d.group == hq // hkv
               for d in decisions), decisions
    types_after = op_types(block)
    assert types_after["tile"] == 0 and types_after["matmul"] == 2
    assert max_rank(block) <= 4  # the rank-5 replication tensors are gone with the tiles
    # K and V are read as stored: both matmuls take a program input as y
    assert {op.y.name for op in block.operations if op.op_type == "matmul"} == {"k", "v"}
    if mapping == "h // G":
        assert types_after["transpose"] == 1 and types_after["gather"] == 0  # only the o_proj transpose
    elif mapping == "h % Hkv":  # Q regrouped by one transpose in, one out; never K/V
        assert types_after["transpose"] == 1 + 2 * (1 if m == 1 else 2) and types_after["gather"] == 0
    else:
        assert types_after["gather"] >= 2  # a gather of Q in and of the output back
    assert_same_numbers(prev, prog, tmp_path)


def test_decode_scores_stay_folded_from_qk_to_pv():
    """q_len 1: the mask [1,1,1,S] broadcasts over the folded rows, so scale, mask, softmax and P·V run on
    [1, Hkv, G, S] with one reshape of Q in and one of the output back (the qfold build's form)."""
    prog = kv_input_program("repeat_kv", 8, 2)
    _, block, _ = run_fold(prog)
    softmax = next(op for op in block.operations if op.op_type == "softmax")
    assert tuple(softmax.outputs[0].shape) == (1, 2, 4, S)
    assert op_types(block)["reshape"] == 3  # Q in, output back, and the o_proj flatten


def test_prefill_mask_ends_the_region_and_merges_group_with_rows():
    """q_len M > 1: Q becomes [1, Hkv, G·M, D]; the mask [1,1,M,S] does not broadcast over G·M, so the
    scores are unfolded (a free reshape) before it and P folded again before P·V."""
    prog = kv_input_program("repeat_kv", 8, 2, m=3, mask_rows=3)
    _, block, _ = run_fold(prog)
    shapes = {op.op_type: tuple(op.outputs[0].shape) for op in block.operations if op.op_type in ("matmul", "add")}
    assert shapes["add"] == (1, 8, 3, S)
    matmuls = [tuple(op.outputs[0].shape) for op in block.operations if op.op_type == "matmul"]
    assert matmuls == [(1, 2, 12, S), (1, 2, 12, D)]


def test_kv_as_state(tmp_path):
    prog = state_program(8, 2)
    prev, block, decisions = run_fold(prog)
    assert [d.folded for d in decisions] == [True, True]
    types_after = op_types(block)
    assert types_after["tile"] == 0 and types_after["expand_dims"] == 0
    assert types_after["coreml_update_state"] == 2 and types_after["slice_update"] == 2
    readers = {op.y.op.op_type for op in block.operations if op.op_type == "matmul"}
    assert readers == {"coreml_update_state"}  # attention reads the updated cache itself
    assert_same_numbers(prev, prog, tmp_path, steps=3)


@pytest.mark.parametrize("hq, hkv", [(8, 2), (6, 1)])
def test_read_only_kv_self_term(hq, hkv, tmp_path):
    prog = self_term_program(hq, hkv)
    prev, block, decisions = run_fold(prog)
    assert len(decisions) == 4 and all(d.folded for d in decisions)
    types_after = op_types(block)
    assert types_after["tile"] == 0 and types_after["expand_dims"] == 0
    mul_self = [op for op in block.operations if op.op_type == "mul" and op.y.name == "v_new"]
    assert len(mul_self) == 1 and tuple(mul_self[0].outputs[0].shape) == (1, hkv, hq // hkv, D)
    assert_same_numbers(prev, prog, tmp_path)


# ------------------------------------------------------------------------------------------------ negatives
def test_mask_tiled_over_heads_is_left_alone(tmp_path):
    @mb.program(input_specs=[mb.TensorSpec((1, 8, 1, D), FP16), mb.TensorSpec((1, 2, S, D), FP16),
                             mb.TensorSpec((1, 2, S, D), FP16), mb.TensorSpec((1, 1, 1, S), FP16)],
                opset_version=IOS18)
    def prog(q, k, v, mask):
        mask8 = mb.tile(x=mask, reps=[1, 8, 1, 1])  # a mask per head: not KV
        return attention(q, repeat_kv(k, 4), repeat_kv(v, 4), mask8)

    prev, block, decisions = run_fold(prog)
    by_shape = {d.input_shape: d for d in decisions}
    assert not by_shape[(1, 1, 1, S)].folded
    assert "feeds add" in by_shape[(1, 1, 1, S)].reason
    assert sum(d.folded for d in decisions) == 2
    assert op_types(block)["tile"] == 1
    assert_same_numbers(prev, prog, tmp_path)


def test_tile_feeding_something_else_and_along_the_sequence_axis():
    @mb.program(input_specs=[mb.TensorSpec((1, 8, 1, D), FP16), mb.TensorSpec((1, 2, S, D), FP16),
                             mb.TensorSpec((1, 2, S, D), FP16)],
                opset_version=IOS18)
    def prog(q, k, v):
        summed = mb.reduce_sum(x=repeat_kv(v, 4), axes=[2])  # a replica feeding a reduction, not attention
        doubled = mb.tile(x=k, reps=[1, 1, 2, 1])  # [1, 2, 2S, D]: along the sequence axis
        scores = mb.matmul(x=mb.reshape(x=q, shape=[1, 2, 4, D]), y=doubled, transpose_y=True)
        same = mb.tile(x=mb.reshape(x=summed, shape=[1, 8, 1, D]), reps=[1, 1, 1, 1])  # copies nothing
        return summed, scores, mb.matmul(x=q, y=same, transpose_y=True)

    _, block, decisions = run_fold(prog)
    assert not any(d.folded for d in decisions)
    reasons = sorted(d.reason for d in decisions)
    assert any("feeds reduce_sum" in r for r in reasons), reasons
    assert any("does not copy along the head axis" in r for r in reasons), reasons
    assert any("copies nothing" in r for r in reasons), reasons
    assert op_types(block)["tile"] == 3


def test_replica_as_left_operand_is_refused():
    @mb.program(input_specs=[mb.TensorSpec((1, 8, D, 1), FP16), mb.TensorSpec((1, 2, S, D), FP16)],
                opset_version=IOS18)
    def prog(qt, k):
        return mb.matmul(x=repeat_kv(k, 4), y=qt)  # K·qᵀ: [1, 8, S, 1]

    _, block, decisions = run_fold(prog)
    assert not decisions[0].folded and "left operand" in decisions[0].reason
    assert op_types(block)["tile"] == 1


def test_rope_table_tiled_over_heads_is_not_attention():
    """A table tiled over heads and multiplied into Q looks like the self term's mul but is not attention."""
    @mb.program(input_specs=[mb.TensorSpec((1, 8, 1, D), FP16), mb.TensorSpec((1, 1, 1, D), FP16)],
                opset_version=IOS18)
    def prog(q, cos):
        return mb.mul(x=q, y=mb.tile(x=cos, reps=[1, 8, 1, 1]))

    _, _, decisions = run_fold(prog)
    assert not decisions[0].folded and "no attention weight" in decisions[0].reason and not decisions[0].replication


def test_nothing_to_fold_leaves_the_program_unchanged():
    @mb.program(input_specs=[mb.TensorSpec((1, 4, 1, D), FP16), mb.TensorSpec((1, 4, S, D), FP16)],
                opset_version=IOS18)
    def prog(q, k):
        return mb.matmul(x=q, y=k, transpose_y=True)

    before = [op.op_type for op in prog.functions["main"].operations]
    _, block, decisions = run_fold(prog)
    assert decisions == [] and [op.op_type for op in block.operations] == before


# ------------------------------------------------------------------------------------------------ mapping
def test_head_mapping_reads_the_chain_not_names():
    src = np.arange(2 * 3 * 4).reshape(1, 2, 3, 4)
    assert head_mapping(np.repeat(src, 3, axis=1), src.size) == HeadMap(2, (0, 0, 0, 1, 1, 1))
    assert head_mapping(np.tile(src, (1, 3, 1, 1)), src.size) == HeadMap(2, (0, 1, 0, 1, 0, 1))
    # K read as Kᵀ: every head [D, S] of an [S, D] source
    assert head_mapping(np.repeat(src, 3, axis=1).swapaxes(-1, -2), src.size) == HeadMap(2, (0, 0, 0, 1, 1, 1), True)
    assert "head axis" in head_mapping(np.tile(src, (1, 1, 2, 1)), src.size)
    assert "copies nothing" in head_mapping(src, src.size)
    uneven = np.concatenate([src[:, [0, 0, 0]], src[:, [1]]], axis=1)
    assert "equal groups" in head_mapping(uneven, src.size)


def test_foreign_package_without_roles_is_folded_and_proved_on_drawn_inputs(tmp_path):
    """A package whose inputs are not a decode step's (no token ids, no input spec): folded, weights checked, and
    the proof runs anyway on inputs drawn within what each can hold (equality holds for any inputs), each draw
    stated."""
    from analyzer.fold.coreml.package import fold_package
    from analyzer.fold.proof import prove_fold

    src = save(kv_input_program("repeat", 8, 2), tmp_path / "foreign.mlpackage")
    report = fold_package(src, tmp_path / "folded.mlpackage")
    assert report.tiles_folded == 2 and report.functions[0].kv_replication_tiles_after == 0
    proof = prove_fold(src, tmp_path / "folded.mlpackage")
    assert proof.checked and proof.roles.startswith("random draws") and len(proof.draws) == 4
    assert proof.within_tolerance and "N(0, 1)" in proof.draws[0]


# ------------------------------------------------------------------------------------------------ K read as Kᵀ, SDPA
def test_chain_ending_in_separate_transposes_folds(tmp_path):
    """repeat_interleave (its last op a transpose) and then Kᵀ as a transpose of its own, not merged by the
    converter: matmul(q, Kᵀ) with no transpose flag. The fold reads K as stored, through transpose_y."""
    @mb.program(input_specs=[mb.TensorSpec((1, 8, 1, D), FP16), mb.TensorSpec((1, 2, S, D), FP16),
                             mb.TensorSpec((1, 2, S, D), FP16), mb.TensorSpec((1, 1, 1, S), FP16)],
                opset_version=IOS18)
    def prog(q, k, v, mask):
        kt = mb.transpose(x=repeat_interleave(k, 4), perm=[0, 1, 3, 2])  # [1, Hq, D, S]
        s = mb.add(x=mb.mul(x=mb.matmul(x=q, y=kt), y=np.float16(D ** -0.5)), y=mask)
        o = mb.matmul(x=mb.softmax(x=s, axis=-1), y=repeat_interleave(v, 4))
        return mb.reshape(x=mb.transpose(x=o, perm=[0, 2, 1, 3]), shape=[1, 1, 8 * D])

    prev, block, decisions = run_fold(prog)
    assert [d.folded for d in decisions] == [True, True] and {d.mapping for d in decisions} == {"h // G"}
    assert op_types(block)["tile"] == 0 and max_rank(block) <= 4
    scores = next(op for op in block.operations if op.op_type == "matmul" and op.y.name == "k")
    assert scores.transpose_y.val and not scores.transpose_x.val  # K as stored, read transposed
    assert_same_numbers(prev, prog, tmp_path)


def sdpa_program(style: str, m: int, mask: tuple | None, hq: int = 8, hkv: int = 2):
    """The iOS 18 fused attention over replicated K/V at fixed shapes, its mask ``mask`` (None: no mask)."""
    replicate, g = STYLES[style], hq // hkv
    qkv = [mb.TensorSpec((1, hq, m, D), FP16), mb.TensorSpec((1, hkv, S, D), FP16), mb.TensorSpec((1, hkv, S, D), FP16)]

    def attend(q, k, v, **mask_arg):
        o = mb.scaled_dot_product_attention(query=q, key=replicate(k, g), value=replicate(v, g), **mask_arg)
        return mb.reshape(x=mb.transpose(x=o, perm=[0, 2, 1, 3]), shape=[1, m, hq * D])

    if mask is None:
        return mb.program(input_specs=qkv, opset_version=IOS18)(lambda q, k, v: attend(q, k, v))

    @mb.program(input_specs=[*qkv, mb.TensorSpec(mask, FP16)], opset_version=IOS18)
    def prog(q, k, v, mask):
        return attend(q, k, v, attn_mask=mask)

    return prog


SDPA_CASES = [  # every mask kind with 3 query rows; decode; the h % Hkv mapping (Q's heads regrouped) with each
    *(("repeat_kv", 3, mask) for mask in ("none", "broadcast", "per row", "per head")),
    ("repeat_kv", 1, "broadcast"), ("repeat", 1, "per head"), ("repeat", 3, "per head"), ("repeat", 3, "per row")]


@pytest.mark.parametrize("style, m, mask", SDPA_CASES)
def test_fused_sdpa_at_fixed_shapes_folds_with_its_mask_aligned(style, m, mask, tmp_path):
    """Q folded to [1, Hkv, G·M, D], K and V read as stored; a mask broadcast over the rows kept, one per row
    tiled over the group, one per head folded like Q; never above rank 4; same numbers."""
    shape = {"none": None, "broadcast": (1, 1, 1, S), "per row": (1, 1, m, S), "per head": (1, 8, m, S)}[mask]
    prog = sdpa_program(style, m, shape)
    prev, block, decisions = run_fold(prog)
    assert [d.folded for d in decisions] == [True, True], [d.reason for d in decisions]
    (sdpa,) = [op for op in block.operations if op.op_type == "scaled_dot_product_attention"]
    assert (sdpa.key.name, sdpa.value.name) == ("k", "v")
    assert tuple(sdpa.query.shape) == (1, 2, 4 * m, D)
    if shape is not None:
        assert tuple(sdpa.attn_mask.shape)[-2] in (1, 4 * m) and sdpa.attn_mask.rank <= 4
    assert op_types(block)["tile"] == (1 if mask == "per row" and m > 1 else 0) and max_rank(block) <= 4
    assert_same_numbers(prev, prog, tmp_path)
