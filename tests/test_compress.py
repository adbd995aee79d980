"""Compression: spec parsing, part rules, and real compressed conversions of a tiny EXAONE 4.0 (4 layers).

No mocks of coremltools. Expected stored sizes are computed here from the model's dimensions and the
schemes' bit widths (indices bits × elements / 8 + LUT entries × 2 bytes; int8 elements + one fp16 scale
per output channel), never from the walker, and compared with what the walker and the accounting read.
"""

from __future__ import annotations

import json
import math

import pytest

from analyzer.analysis.compression import compression_report, weight_part
from analyzer.convert.compress import (
    DEFAULT_GROUP_CHANNELS,
    CompressionError,
    canonical_spec,
    compress_model,
    needs_untie,
    parse_spec,
    plan_weights,
)

TINY = ["hidden_size=256", "intermediate_size=512", "vocab_size=1000", "num_hidden_layers=4"]
TWO_LAYERS = [*TINY[:-1], "num_hidden_layers=2"]  # the child-process builds: two of them fit the time budget
MIXED = "layers[0,3]=int8,ffn=pal4,attn=pal4,lm_head=pal6,embed=pal4"  # top8-like on 4 layers


# ------------------------------------------------------------------------------------------------- specs
def test_presets_expand_with_first_last_rules():
    assert canonical_spec("base", 30) == "ffn=pal4,attn=pal4,embed=pal4,lm_head=pal6"
    assert canonical_spec("top8", 30) == "ffn=pal4,attn=pal4,embed=pal4,lm_head=pal6,layers[0-3,26-29]=int8"
    assert canonical_spec("top12", 30) == "ffn=pal4,attn=pal4,embed=pal4,lm_head=pal6,layers[0-5,24-29]=int8"
    # on 4 layers first:4 and last:4 cover everything: every layer int8; a preset's first:6 is clipped
    assert canonical_spec("top8", 4) == "ffn=int8,attn=int8,embed=pal4,lm_head=pal6"
    assert canonical_spec("top12", 4) == canonical_spec("top8", 2) == canonical_spec("top8", 4)


@pytest.mark.parametrize("text", [
    "top8",
    "base,layers[0-3,26-29]=int8",
    "layers[26-29,0-3]=int8,lm_head=pal6,embed=pal4,attn=pal4,ffn=pal4",
    " FFN = pal4 , attn=pal4:uniform,embed=pal4, lm_head=PAL6,layers[last:4,first:4]=int8 ",
    "ffn=pal4,attn=pal4,embed=pal4,lm_head=pal6,ffn[0,1,2,3,26-29]=int8,attn[first:4,last:4]=int8",
    "top8,group=16",
])
def test_canonical_text_is_stable_and_order_independent(text):
    assert canonical_spec(text, 30) == canonical_spec("top8", 30)


@pytest.mark.parametrize("text", [
    "top8", "top12,lm_head=int8", "ffn=pal4,ffn[last:2]=pal6", "attn=int8,layers[5]=pal3:kmeans,group=32",
    "ffn=pal4,attn=pal4,layers[0-29]=int8", "embed=int8,lm_head=int8", "ffn=pal2,attn[0-14]=pal8,attn[15-29]=pal6",
])
def test_canonical_text_parses_back_to_the_same_plan(text):
    plan = parse_spec(text, 30)
    assert parse_spec(plan.spec, 30) == plan
    assert canonical_spec(plan.spec, 30) == plan.spec


def test_resolution_most_specific_wins_and_user_beats_preset():
    plan = parse_spec("top8,ffn=pal6,attn[2]=fp16", 30)
    assert plan.ffn[0].token == "int8" and plan.ffn[10].token == "pal6"  # preset's layers[] beat ffn=
    assert plan.attn[2].token == "fp16" and plan.attn[1].token == "int8"
    plan = parse_spec("top8,layers[0]=pal4", 30)
    assert plan.ffn[0].token == plan.attn[0].token == "pal4" and plan.ffn[1].token == "int8"
    assert parse_spec("ffn=pal4", 2).embed.token == "fp16"  # unnamed parts stay fp16
    assert parse_spec("ffn=int8,group=8", 2).group_channels == DEFAULT_GROUP_CHANNELS  # no palette, no group


@pytest.mark.parametrize(("text", "fragments"), [
    ("ffn=pal5", ["'ffn=pal5'", "5-bit", "2, 3, 4, 6, 8"]),
    ("ffn=pal16", ["'ffn=pal16'", "16-bit"]),
    ("ffn=int4", ["'ffn=int4'", "unknown scheme 'int4'"]),
    ("mlp=pal4", ["'mlp=pal4'", "unknown part 'mlp'"]),
    ("pal4", ["'pal4'", "not a preset"]),
    ("layers[0-4]=int8", ["'layers[0-4]=int8'", "layer 4 is out of range", "4 layers"]),
    ("layers[7]=int8", ["'layers[7]=int8'", "layer 7", "0-3"]),
    ("layers[last:5]=int8", ["'layers[last:5]=int8'", "last:5"]),
    ("layers[3-1]=int8", ["'layers[3-1]=int8'", "backwards"]),
    ("layers[x]=int8", ["'layers[x]=int8'", "'x'"]),
    ("layers=int8", ["'layers=int8'", "needs a set"]),
    ("embed[0]=int8", ["'embed[0]=int8'", "no layers"]),
    ("ffn=pal4,ffn=int8", ["'ffn=pal4'", "'ffn=int8'"]),
    ("layers[0-2]=int8,layers[2-3]=pal6", ["'layers[0-2]=int8'", "'layers[2-3]=pal6'", "layer 2"]),
    ("top8,top12", ["two presets"]),
    ("ffn=pal4,,attn=pal4", ["empty item"]),
    ("layers[0=int8", ["'[' without ']'"]),
    ("group=0,ffn=pal4", ["'group=0'", "positive"]),
    ("", ["empty"]),
])
def test_bad_specs_name_the_token(text, fragments):
    with pytest.raises(CompressionError) as e:
        parse_spec(text, 4)
    for f in fragments:
        assert f in str(e.value)


def test_needs_untie_when_embed_and_lm_head_differ():
    assert needs_untie(parse_spec("top8", 30))
    assert not needs_untie(parse_spec("ffn=pal4,embed=pal6,lm_head=pal6", 30))
    assert not needs_untie(parse_spec("ffn=pal4", 30))  # both fp16


@pytest.mark.parametrize(("name", "readers", "expected"), [
    ("model_model_layers_12_self_attn_q_proj_weight_to_fp16", ["linear"], (("attn",), 12)),
    ("model_model_layers_0_self_attn_qkv_proj_weight_to_fp16", ["linear"], (("attn",), 0)),  # phi3 fused
    ("model_model_layers_3_mlp_gate_up_proj_weight_to_fp16", ["linear"], (("ffn",), 3)),  # phi3 fused
    ("model_model_layers_1_mlp_down_proj_weight_to_fp16", ["linear"], (("ffn",), 1)),
    ("model_layers_7_feed_forward_w1_weight", ["linear"], (("ffn",), 7)),
    ("model_layers_7_attention_wq_weight", ["linear"], (("attn",), 7)),
    ("model_model_embed_tokens_weight_to_fp16", ["gather"], (("embed",), None)),
    ("model_model_embed_tokens_weight_to_fp16", ["gather", "linear"], (("embed", "lm_head"), None)),  # tied
    ("model_lm_head_weight_to_fp16", ["linear"], (("lm_head",), None)),
    ("lm_head_weight_to_fp16", ["linear"], (("lm_head",), None)),
    ("model_model_layers_2_router_weight", ["linear"], None),  # neither attention nor FFN
    ("some_projection_weight", ["linear"], None),
    ("rope_cos_table", ["gather"], None),
])
def test_weight_part_rule(name, readers, expected):
    assert weight_part(name, readers) == expected


def test_cli_lists_presets_and_resolves_a_spec(capsys):
    from analyzer.cli import main

    assert main(["compression", "top8", "--layers", "4", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {p["name"] for p in doc["presets"]} == {"base", "top8", "top12"}
    assert doc["resolved"]["spec"] == canonical_spec("top8", 4)
    assert [r["ffn"] for r in doc["resolved"]["layers"]] == ["int8"] * 4
    assert main(["compression", "--layers", "30"]) == 0
    out = capsys.readouterr().out
    assert "layers[0-3,26-29]=int8" in out and "sensitivity" in out
    assert main(["compression", "ffn=pal5"]) == 1
    assert "'ffn=pal5'" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------- helpers
def expected_stored_bytes(shape: tuple[int, int], token: str) -> int:
    """Stored size from dims and bits: int8 = O·I bytes + an fp16 scale per output channel; palN = O·I·N/8
    bytes of indices + one LUT of 2^N fp16 per group of output channels (16, or gcd(O, 16) when 16 does not
    divide O)."""
    out_ch, in_ch = shape
    if token == "int8":
        return out_ch * in_ch + 2 * out_ch
    bits = int(token.removeprefix("pal"))
    group = math.gcd(out_ch, DEFAULT_GROUP_CHANNELS)
    return math.ceil(out_ch * in_ch * bits / 8) + (out_ch // group) * (2**bits) * 2


def linear_weights(geometry, intermediate: int) -> dict[str, tuple[str, int, tuple[int, int]]]:
    """Const name → (part, layer, [out, in]) of every projection of the tiny model."""
    h, q, kv = geometry.hidden_size, geometry.num_q_heads * geometry.head_dim, geometry.num_kv_heads * geometry.head_dim
    shapes = {"self_attn_q_proj": (q, h), "self_attn_k_proj": (kv, h), "self_attn_v_proj": (kv, h),
              "self_attn_o_proj": (h, q), "mlp_gate_proj": (intermediate, h), "mlp_up_proj": (intermediate, h),
              "mlp_down_proj": (h, intermediate)}
    return {f"model_model_layers_{i}_{mod}_weight_to_fp16": ("attn" if mod.startswith("self_attn") else "ffn", i, s)
            for i in range(geometry.num_layers) for mod, s in shapes.items()}


def weight_producers(program) -> dict[str, tuple[object, str]]:
    """Tensor name read as a linear weight / gather table → (producer op, reader op type)."""
    out = {}
    for op in program.ops:
        for ref in op.inputs:
            if ref.producer is not None and (op.type, ref.param) in (("linear", "weight"), ("gather", "x")):
                out.setdefault(ref.tensor.name, (program.ops[ref.producer], op.type))
    return out


def find(producers: dict, const_name: str):
    """The entry for a const, whichever suffix coremltools gave the constexpr that replaced it."""
    hits = [k for k in producers if k == const_name or k.startswith(const_name + "_")]
    assert len(hits) == 1, (const_name, hits)
    return producers[hits[0]]


# ------------------------------------------------------------------------------------------------- builds
@pytest.fixture(scope="module")
def source():
    from analyzer.model.sources import resolve_source

    return resolve_source("exaone-4.0-1.2b", TINY)


@pytest.fixture(scope="module")
def geometry(source):
    from analyzer.model.sources import geometry_of, load_config

    config = load_config(source)
    return geometry_of(config), config.intermediate_size


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The fp16 and top8 builds of a 2-layer model through the child process (one equivalence step), one request
    for both (one child, as ``build --compression`` would convert them)."""
    from analyzer.analysis.record import read_analysis_file
    from analyzer.convert.launch import run_builds
    from analyzer.model.sources import resolve_source
    from analyzer.model.spec import BuildSpec

    source = resolve_source("exaone-4.0-1.2b", TWO_LAYERS)
    root = tmp_path_factory.mktemp("builds")
    names = {"fp16": None, "top8": canonical_spec("top8", 2)}
    results = run_builds([BuildSpec(source, "qfold", "state", 64, comp, 1) for comp in names.values()], root=root)
    return {name: (r, read_analysis_file(r.path)) for name, r in zip(names, results, strict=True)}


@pytest.fixture(scope="module")
def mixed(source, tmp_path_factory):
    """The tied model untied in torch, converted without const deduplication, saved as is (the fp16
    reference) and compressed with MIXED."""
    from analyzer.convert.child import convert_step
    from analyzer.ir.coreml.mil_reader import read_program
    from analyzer.model.decode import DecodeStep, build_model, untie_embeddings_

    plan = parse_spec(MIXED, 4)
    assert needs_untie(plan)
    model = build_model(source)
    assert untie_embeddings_(model)
    mlmodel = convert_step(DecodeStep(model, 64, "qfold", "state").eval(), keep_duplicate_consts=True)
    assignments = plan_weights(mlmodel, plan)
    compressed = compress_model(mlmodel, plan)
    folder = tmp_path_factory.mktemp("mixed")
    mlmodel.save(str(folder / "fp16.mlpackage"))
    compressed.save(str(folder / "mixed.mlpackage"))
    return plan, assignments, read_program(folder / "mixed.mlpackage"), read_program(folder / "fp16.mlpackage")


@pytest.mark.conversion
def test_mixed_config_puts_the_expected_constexpr_on_each_weight(mixed, geometry):
    _, assignments, program, _ = mixed
    geo, intermediate = geometry
    producers = weight_producers(program)
    expected = {name: (part, layer, shape, "int8" if layer in (0, 3) else "pal4")
                for name, (part, layer, shape) in linear_weights(geo, intermediate).items()}
    expected["model_lm_head_weight_to_fp16"] = ("lm_head", None, (geo.vocab_size, geo.hidden_size), "pal6")
    expected["model_model_embed_tokens_weight_to_fp16"] = ("embed", None, (geo.vocab_size, geo.hidden_size), "pal4")
    assert {a.const_name: (a.parts, a.layer, a.scheme.token) for a in assignments} == {
        n: ((part,), layer, token) for n, (part, layer, _, token) in expected.items()}
    for name, (_part, _layer, (out_ch, in_ch), token) in expected.items():
        op, _reader = find(producers, name)
        ins = {r.param: r.tensor for r in op.inputs}
        if token == "int8":
            assert op.type == "constexpr_blockwise_shift_scale", name
            assert (ins["data"].dtype, ins["data"].shape) == ("int8", (out_ch, in_ch)), name
            assert (ins["scale"].dtype, ins["scale"].shape) == ("fp16", (out_ch, 1)), name
            assert "offset" not in ins, name  # symmetric
        else:
            bits = int(token.removeprefix("pal"))
            assert op.type == "constexpr_lut_to_dense", name
            assert (ins["indices"].dtype, ins["indices"].shape) == (f"uint{bits}", (out_ch, in_ch)), name
            groups = out_ch // math.gcd(out_ch, DEFAULT_GROUP_CHANNELS)
            assert (ins["lut"].dtype, ins["lut"].shape) == ("fp16", (groups, 1, 2**bits, 1)), name
    # the report reads the same facts back from the graph
    report = {w.name: w for w in compression_report(program).weights}
    assert len(report) == len(expected)
    for name, (part, layer, shape, token) in expected.items():
        (row,) = [w for k, w in report.items() if k.startswith(name)]
        assert (row.parts, row.layer, row.scheme) == ((part,), layer, token)
        assert row.stored_bytes == expected_stored_bytes(shape, token)
        assert row.dense_fp16_bytes == shape[0] * shape[1] * 2


@pytest.mark.conversion
def test_mixed_config_weight_bytes_match_sizes_computed_from_dims(mixed, geometry):
    from analyzer.analysis.accounting import account

    _, _, program, fp16_program = mixed
    geo, intermediate = geometry
    vocab_shape = (geo.vocab_size, geo.hidden_size)
    linear = {n: (s, "int8" if layer in (0, 3) else "pal4")
              for n, (_, layer, s) in linear_weights(geo, intermediate).items()}
    linear["lm_head"] = (vocab_shape, "pal6")
    exp_linear = sum(expected_stored_bytes(s, t) for s, t in linear.values())
    exp_embed_row = round(expected_stored_bytes(vocab_shape, "pal4") / geo.vocab_size)  # one token gathered
    rows = account(program).op_rows()
    assert sum(r["weights"] for r in rows if r["type"] == "linear") == exp_linear
    assert sum(r["weights"] for r in rows if r["type"] == "gather") == exp_embed_row
    # everything else (norm scales, small consts) is unchanged from the same model left fp16
    fp16_weights = account(fp16_program).totals()["weights"]
    dense_linear = sum(s[0] * s[1] * 2 for s, _ in linear.values())
    dense_row = geo.hidden_size * 2
    total = account(program).totals()["weights"]
    assert total - fp16_weights == (exp_linear - dense_linear) + (exp_embed_row - dense_row)


@pytest.mark.conversion
def test_untied_embedding_and_lm_head_are_two_differently_compressed_consts(mixed):
    _, _, program, _ = mixed
    producers = weight_producers(program)
    embed_op, embed_reader = find(producers, "model_model_embed_tokens_weight_to_fp16")
    head_op, head_reader = find(producers, "model_lm_head_weight_to_fp16")
    assert embed_op.index != head_op.index
    assert (embed_reader, head_reader) == ("gather", "linear")
    consumers = program.consumers()
    assert {program.ops[c].type for c in consumers[embed_op.index]} == {"gather"}
    assert {program.ops[c].type for c in consumers[head_op.index]} == {"linear"}
    idx = {op.name: next(r.tensor.dtype for r in op.inputs if r.param == "indices") for op in (embed_op, head_op)}
    assert idx == {embed_op.name: "uint4", head_op.name: "uint6"}


@pytest.mark.conversion
def test_tied_model_asked_for_two_configs_fails_with_our_error(builds):
    import coremltools as ct

    result, _ = builds["fp16"]
    mlmodel = ct.models.MLModel(str(result.path / "model.mlpackage"), skip_model_load=True)
    plan = parse_spec("ffn=pal4,embed=pal4,lm_head=pal6", 2)
    with pytest.raises(CompressionError) as e:
        compress_model(mlmodel, plan)
    msg = str(e.value)
    # the const's name: the torch parameter's (materialised builds convert an fp16 model: no ``_to_fp16`` cast)
    assert "model_model_embed_tokens_weight" in msg and "tied" in msg and "untie_embeddings_" in msg
    assert "config conflict" not in msg
    # the same model takes one scheme for both
    same = plan_weights(mlmodel, parse_spec("embed=pal6,lm_head=pal6", 2))
    (tied,) = [a for a in same if a.parts == ("embed", "lm_head")]
    assert tied.scheme.token == "pal6" and set(tied.consumer_types) == {"gather", "linear"}


@pytest.mark.conversion
def test_kmeans_without_scikit_learn_fails_before_compressing(builds):
    import importlib.util

    import coremltools as ct

    if importlib.util.find_spec("sklearn") is not None:
        pytest.skip("scikit-learn is installed: small k-means palettes are possible")
    result, _ = builds["fp16"]
    mlmodel = ct.models.MLModel(str(result.path / "model.mlpackage"), skip_model_load=True)
    with pytest.raises(CompressionError, match=r"pal4:kmeans on 'model_model_layers_.*scikit-learn"):
        compress_model(mlmodel, parse_spec("ffn=pal4:kmeans", 2))


@pytest.mark.conversion
def test_end_to_end_top8_build_reads_fewer_weight_bytes(builds):
    (fp16, fp16_doc), (top8, top8_doc) = builds["fp16"], builds["top8"]
    assert fp16.key != top8.key
    assert top8_doc.build.spec.compression == canonical_spec("top8", 2)
    assert top8_doc.build.untied_embeddings is True  # embed pal4 vs lm_head pal6 on a tied model
    w_fp16 = fp16_doc.bytes_per_token.weights
    w_top8 = top8_doc.bytes_per_token.weights
    assert w_top8 < 0.6 * w_fp16  # int8 projections (~half) and 6-bit lm_head
    counts = top8_doc.summary.op_counts
    assert counts.get("constexpr_blockwise_shift_scale") == 14  # 7 projections × 2 layers
    assert counts.get("constexpr_lut_to_dense") == 2  # embedding and lm_head
    report = top8_doc.compression
    assert report.compressed_count == report.total.count == 16
    assert {k: v.count for k, v in report.by_part.items()} == {"attn": 8, "ffn": 6, "embed": 1, "lm_head": 1}
    fp16_report = fp16_doc.compression
    assert fp16_report.compressed_count == 0 and "embed+lm_head" in fp16_report.by_part  # one tied const
    assert report.total.stored_bytes < fp16_report.total.stored_bytes
    # the stored file says the same (the compression report is written for readers of analysis.json)
    stored = json.loads((top8.path / "analysis.json").read_text())["compression_report"]
    assert stored == json.loads(json.dumps(report.to_json()))
