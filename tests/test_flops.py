"""FLOPs per op on hand-built MIL programs whose counts can be added up on paper, and on the shipped full-size
EXAONE analyses against the analytic figure computed from the preset config."""

import math

import coremltools as ct
import numpy as np
import pytest
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types

from analyzer.analysis.flops import FLOP_CATEGORIES, FLOP_RULES, count_flops
from analyzer.analysis.record import read_analysis_file
from analyzer.ir.coreml.mil_reader import read_program
from analyzer.ir.phase import call_shape
from analyzer.model.sources import DEFAULT_PRESET, load_config, resolve_source
from analyzer.report.catalog import SHIPPED_DIR, shipped_name

H, FF, V, N, S, D, HEADS = 16, 24, 40, 6, 10, 4, 2  # hidden, MLP, vocab, rows, cache slots, head_dim, heads


def _save(prog, path):
    model = ct.convert(prog, convert_to="mlprogram", pass_pipeline=ct.PassPipeline.EMPTY,
                       minimum_deployment_target=ct.target.iOS18)
    model.save(str(path))
    return path


@pytest.fixture(scope="module")
def block(tmp_path_factory):
    """A named attention block and MLP on N = 6 rows, every op of a kind the FLOP rules know:

    q = linear(x, Wq) [1,6,8] (zero bias) · reshape [1,2,6,4] · scores = matmul(q, k_cache, transpose_y) [1,2,6,10]
    · mul scale · add mask · softmax · out = matmul(p, v_cache) [1,2,6,4] · reshape [1,6,8] · o = linear(Wo, bias 1)
    [1,6,16] · up = linear(W_up) [1,6,24] · silu · down = linear(W_down) [1,6,16] · rsqrt · reduce_mean over
    hidden [1,6,1] · logits = linear(lm_head) on the last row [1,1,40] · a matmul of x by a constant unnamed
    matrix [16,3] (other)."""
    rng = np.random.default_rng(0)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float16)

    @mb.program(input_specs=[mb.TensorSpec(shape=(1, N, H), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, HEADS, S, D), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, HEADS, S, D), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, 1, N, S), dtype=types.fp16)],
                opset_version=ct.target.iOS18)
    def prog(x, k_cache, v_cache, mask):
        q = mb.linear(x=x, weight=mb.const(val=w(HEADS * D, H), name="model_layers_0_self_attn_q_proj_weight"),
                      bias=mb.const(val=np.zeros(HEADS * D, np.float16), name="zero_bias"), name="q_proj")
        q = mb.reshape(x=q, shape=[1, N, HEADS, D], name="q_split")
        q = mb.transpose(x=q, perm=[0, 2, 1, 3], name="q_heads")  # [1, 2, 6, 4]
        scores = mb.matmul(x=q, y=k_cache, transpose_y=True, name="scores")  # [1, 2, 6, 10]
        scores = mb.mul(x=scores, y=np.float16(0.5), name="scaled")
        scores = mb.add(x=scores, y=mask, name="masked")
        p = mb.softmax(x=scores, axis=-1, name="probs")
        out = mb.matmul(x=p, y=v_cache, name="values")  # [1, 2, 6, 4]
        out = mb.transpose(x=out, perm=[0, 2, 1, 3], name="out_rows")
        out = mb.reshape(x=out, shape=[1, N, HEADS * D], name="out_merged")
        o = mb.linear(x=out, weight=mb.const(val=w(H, HEADS * D), name="model_layers_0_self_attn_o_proj_weight"),
                      bias=mb.const(val=np.ones(H, np.float16), name="o_bias"), name="o_proj")
        up = mb.linear(x=o, weight=mb.const(val=w(FF, H), name="model_layers_0_mlp_up_proj_weight"), name="up_proj")
        up = mb.silu(x=up, name="act")
        down = mb.linear(x=up, weight=mb.const(val=w(H, FF), name="model_layers_0_mlp_down_proj_weight"),
                         name="down_proj")
        r = mb.rsqrt(x=down, name="rs")
        mean = mb.reduce_mean(x=r, axes=[-1], keep_dims=True, name="mean")
        last = mb.slice_by_index(x=r, begin=[0, N - 1, 0], end=[1, N, H], name="last_row")
        logits = mb.linear(x=last, weight=mb.const(val=w(V, H), name="lm_head_weight"), name="logits")
        other = mb.matmul(x=x, y=mb.const(val=w(H, 3), name="some_matrix"), name="other_mm")
        return logits, mean, other

    path = _save(prog, tmp_path_factory.mktemp("flops") / "block.mlpackage")
    return read_program(path)


def _op(program, name):
    return next(op for op in program.ops if op.name == name)


def test_every_op_counts_what_the_paper_says(block):
    acc = count_flops(block)
    by_name = {o.name: o for o in acc.ops}
    expected = {  # name: (category, FLOPs), derived from the shapes by hand
        "q_proj": ("projections", 2 * N * H * HEADS * D),  # the zero bias adds nothing
        "scores": ("attention_scores", 2 * HEADS * N * S * D),  # K = head_dim
        "scaled": ("other", HEADS * N * S),
        "masked": ("other", HEADS * N * S),
        "probs": ("other", 5 * HEADS * N * S),
        "values": ("attention_values", 2 * HEADS * N * D * S),  # K = cache slots
        "o_proj": ("projections", 2 * N * HEADS * D * H + N * H),  # a bias of ones: one add per output
        "up_proj": ("ffn", 2 * N * H * FF),
        "act": ("other", N * FF),
        "down_proj": ("ffn", 2 * N * FF * H),
        "rs": ("other", N * H),
        "mean": ("other", N * H),  # one per input element
        "logits": ("lm_head", 2 * 1 * H * V),
        "other_mm": ("other", 2 * N * H * 3),
    }
    for name, (category, flops) in expected.items():
        op = by_name[name]
        assert (op.get(category), op.total) == (flops, flops), (name, op)
    moving = {"q_split", "q_heads", "out_rows", "out_merged", "last_row"}
    assert all(by_name[n].total == 0 for n in moving)
    assert acc.per_call().total == sum(f for _, f in expected.values())
    assert acc.unruled_op_types == () and acc.unsized == ()


def test_per_token_divides_by_the_tokens_of_a_call(block):
    one, six = count_flops(block, 1), count_flops(block, N)
    for c in FLOP_CATEGORIES:
        assert six.per_token().get(c) == round(one.per_call().get(c) / N)
    assert six.per_call() == one.per_call()
    layer_rows = {r.layer: r.flops.total for r in six.layers(per_token=False)}
    assert sum(layer_rows.values()) == six.per_call().total
    with pytest.raises(ValueError, match="tokens_per_call"):
        count_flops(block, 0)


def test_call_shape_of_a_foreign_program_comes_from_its_inputs(block):
    """No token ids: a hidden-state input [1, N, H] is N tokens per call (a prefill chunk), and says so."""
    call = call_shape(block)
    assert (call.phase, call.tokens_per_call) == ("prefill", N) and "hidden states" in call.how


def test_an_op_without_a_rule_is_listed_not_silently_zero(block):
    from dataclasses import replace

    ops = tuple(replace(op, type="made_up_op") if op.name == "act" else op for op in block.ops)
    acc = count_flops(replace(block, ops=ops))
    assert acc.unruled_op_types == ("made_up_op",)
    assert count_flops(block).per_call().total - acc.per_call().total == N * FF


def test_rules_cover_every_compute_op_the_byte_account_knows():
    from analyzer.analysis.byte_rules import COMPUTE_OPS, RULES

    missing = sorted(t for t in (*COMPUTE_OPS, *RULES) if t not in FLOP_RULES)
    assert missing == []


# ---------------------------------------------------------------------------------------------- shipped, full size
@pytest.mark.parametrize("compression", [None, "top8"])
@pytest.mark.parametrize("variant", ["repeat_kv", "qfold"])
def test_flops_per_decode_token_of_full_size_exaone_match_the_analytic_figure(variant, compression):
    """2 × (parameters of every matmul/linear, lm_head included although tied) + the attention matmuls over the
    whole static cache (2 × 2 × Hq × ctx × D per layer), from the preset config, within 1% of the total; the
    matmul categories exactly (the rest is norms, RoPE, scale, mask and softmax)."""
    a = read_analysis_file(SHIPPED_DIR / shipped_name(DEFAULT_PRESET, variant, "state", 4096, compression))
    cfg = load_config(resolve_source(DEFAULT_PRESET))
    h, i, v, layers = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    hq, hkv, d, ctx = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, a.build.spec.ctx
    assert cfg.tie_word_embeddings  # the lm_head reads the embedding table and is counted all the same
    projections = layers * (h * hq * d + 2 * h * hkv * d + hq * d * h)
    ffn = layers * 3 * h * i
    lm_head = v * h
    attention = layers * 2 * 2 * hq * ctx * d
    analytic = 2 * (projections + ffn + lm_head) + attention
    f = a.flops.per_token()
    assert a.call.tokens_per_call == 1
    assert (f.projections, f.ffn, f.lm_head) == (2 * projections, 2 * ffn, 2 * lm_head)
    assert f.attention_scores == f.attention_values == attention // 2
    assert math.isclose(f.total, analytic, rel_tol=0.01), (f.total, analytic)
    assert f.other < 0.01 * analytic


def test_sdpa_and_einsum(tmp_path):
    """``scaled_dot_product_attention`` counts its two matmuls, scale, mask and softmax; ``einsum`` its contraction,
    estimated from the shapes (and listed as estimated)."""
    @mb.program(input_specs=[mb.TensorSpec(shape=(1, HEADS, N, D), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, HEADS, S, D), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, HEADS, S, D), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, 1, N, S), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, N, HEADS, D), dtype=types.fp16),
                             mb.TensorSpec(shape=(1, D, HEADS, S), dtype=types.fp16)],
                opset_version=ct.target.iOS18)
    def prog(q, k, v, mask, qe, ke):
        a = mb.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=mask, name="sdpa")
        e = mb.einsum(values=(qe, ke), equation="nchw,nwhu->nchu", name="qk")  # MIL's einsum form: [1, N, 2, S]
        return a, e

    program = read_program(_save(prog, tmp_path / "sdpa.mlpackage"))
    acc = count_flops(program)
    by_name = {o.name: o for o in acc.ops}
    scores = HEADS * N * S
    sdpa = by_name["sdpa"]
    assert (sdpa.attention_scores, sdpa.attention_values, sdpa.other) == (2 * scores * D, 2 * scores * D, 7 * scores)
    assert by_name["qk"].total == 2 * scores * D and acc.estimated == ("qk",)
