"""The 7-8B presets (mistral-7b-v0.3, llama-3.1-8b, qwen2.5-7b): variants equivalent and tiles as expected at
2 small layers (as tests/test_families.py), the weights bytes per token of an analysis-mode build equal to a
parameter count made from the config alone, and (QFOLD_FULL=1) the full-size A/B."""

import pytest
import torch

from analyzer.analysis.accounting import account
from analyzer.convert.header_blobs import to_program, walk_program
from analyzer.convert.step import trace_step
from analyzer.ir.coreml.mil_reader import read_program
from analyzer.model.decode import DecodeStep, build_model
from analyzer.model.equivalence import check_equivalence
from analyzer.model.sources import geometry_of, load_config, resolve_source
from analyzer.model.valuefree import ZeroPageProducts, assign_value_free_weights_, build_value_free_model
from tests.conftest import PRESET_CTX, preset_source

LARGE = ["mistral-7b-v0.3", "llama-3.1-8b", "qwen2.5-7b"]
NEW = ["llama-3.1-8b", "qwen2.5-7b"]
CTX = PRESET_CTX


def weight_bytes_per_token(cfg) -> int:
    """fp16 parameter bytes one decode token reads under the account's rules, from the config alone (llama,
    mistral, qwen2, qwen3 and exaone4 layouts): per layer the q/k/v/o and gate/up/down projections, the q/k/v
    biases where the family has them (qwen2; ``attention_bias``), two RMSNorms, per-head q/k RMSNorms (qwen3,
    exaone4); then the embedding row a token gathers (not the table), the whole lm_head (tied or not), the
    final norm and RoPE's head_dim/2 inverse frequencies (a buffer the graph reads)."""
    h, i, v, n = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    hq, hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = getattr(cfg, "head_dim", None) or h // hq
    per_layer = h * hq * d + 2 * h * hkv * d + hq * d * h + 3 * h * i + 2 * h
    if cfg.model_type == "qwen2" or getattr(cfg, "attention_bias", False):
        per_layer += hq * d + 2 * hkv * d
    if cfg.model_type in ("qwen3", "exaone4"):
        per_layer += 2 * d
    return 2 * (n * per_layer + h + v * h + h + d // 2)


def parameter_count(cfg) -> int:
    """Parameters of the model, from the config alone (same layouts): the untied embedding table counts once
    more than a token reads."""
    h, v = cfg.hidden_size, cfg.vocab_size
    d = getattr(cfg, "head_dim", None) or h // cfg.num_attention_heads
    read = weight_bytes_per_token(cfg) // 2 - h - d // 2  # minus the gathered row and the inv_freq buffer
    return read + v * h * (0 if cfg.tie_word_embeddings else 1)


@pytest.mark.parametrize("preset", NEW)
def test_new_presets_variants_agree_with_each_other_and_the_family(preset):
    report = check_equivalence(build_model(preset_source(preset)), "state", ctx=32, steps=8)
    pairs = {p.dtype: p for p in report.pairs}
    assert pairs["fp16"].bit_identical
    assert pairs["fp32"].greedy_agree_steps == 8 and pairs["fp32"].max_abs_diff < 1e-4
    assert report.reference.greedy_agree_steps == 8


@pytest.mark.conversion
@pytest.mark.parametrize("preset", NEW)
def test_new_presets_tile_two_per_layer_of_hq_ctx_d(preset, preset_packages):
    g = geometry_of(load_config(preset_source(preset)))
    counts = {}
    for variant in ("repeat_kv", "qfold"):
        program = read_program(preset_packages(preset, variant))
        counts[variant] = len(program.tiles())
        if variant == "repeat_kv":
            assert {t.output_bytes for t in program.tiles()} == {g.num_q_heads * CTX * g.head_dim * 2}
    assert counts == {"repeat_kv": 2 * g.num_layers, "qfold": 0}


@pytest.mark.parametrize("preset", [*LARGE, "llama-3.1-70b", "exaone-4.0-1.2b", "qwen3-0.6b", "llama-3.2-1b"])
def test_parameter_counts_match_the_models_own(preset):
    """The config-only count against transformers' own model built on the meta device (no memory), and the
    7-8B and 70B models' published sizes (8.03B, 7.25B, 7.62B, 70.6B parameters, their Hugging Face model pages)."""
    from transformers import AutoModelForCausalLM

    cfg = load_config(resolve_source(preset))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())
    published = {"llama-3.1-8b": 8.03e9, "mistral-7b-v0.3": 7.25e9, "qwen2.5-7b": 7.62e9, "llama-3.1-70b": 70.6e9}
    if preset in published:
        assert parameter_count(cfg) == pytest.approx(published[preset], rel=0.005)


@pytest.mark.conversion
@pytest.mark.parametrize("preset", [*LARGE, "llama-3.1-70b"])
def test_two_layer_full_width_weights_equal_the_parameter_count(preset, tmp_path):
    """Value-free (nothing materialised even at full width, 8192 wide for the 70B): the weights bytes per token
    are the analytic figure, the untied embedding charged for one row, the lm_head for all of it."""
    source = resolve_source(preset, ["num_hidden_layers=2"])
    model = build_value_free_model(source)
    step = DecodeStep(model, CTX, "qfold", "state", lazy_cache=True).eval()
    with ZeroPageProducts(model):  # as analysis mode traces
        traced = trace_step(step)
    assign_value_free_weights_(model)
    program = walk_program(to_program(traced, step), tmp_path)
    assert account(program).totals()["weights"] == weight_bytes_per_token(load_config(source))


# ------------------------------------------------------------------------------------------------- full size
@pytest.mark.full
@pytest.mark.parametrize("preset", LARGE)
def test_full_size_ab_in_analysis_mode(preset, tmp_path):
    """Both variants at ctx 4096 in analysis mode: weights = the parameter count, tiles = 2 per layer of
    Hq·ctx·D·2 bytes for repeat_kv and none for Q-fold (bench/fast.py measures the time and memory)."""
    from analyzer.analysis.record import load_analysis
    from analyzer.convert.launch import run_builds
    from analyzer.model.spec import ANALYSIS_MODE, BuildSpec

    source = resolve_source(preset)
    cfg = load_config(source)
    g = geometry_of(cfg)
    specs = [BuildSpec(source, v, "state", 4096, build_mode=ANALYSIS_MODE) for v in ("repeat_kv", "qfold")]
    docs = {s.variant: load_analysis(r.path) for s, r in zip(specs, run_builds(specs, tmp_path), strict=True)}
    for doc in docs.values():
        assert doc.bytes_per_token.weights == weight_bytes_per_token(cfg)
    tile = g.num_q_heads * 4096 * g.head_dim * 2
    assert docs["repeat_kv"].summary.tile_count == 2 * g.num_layers
    assert docs["repeat_kv"].summary.tile_output_bytes == 2 * g.num_layers * tile
    assert docs["qfold"].summary.tile_count == 0


@pytest.mark.full
def test_full_size_default_ab_in_analysis_mode_equals_the_shipped_analyses(tmp_path):
    """The shipped analyses (materialised, fp32-traced builds) and an analysis-mode A/B of the same spec: every
    byte category, the bytes of every layer and every op count, const and cast included."""
    from analyzer.analysis.record import load_analysis
    from analyzer.convert.launch import run_builds
    from analyzer.model.sources import DEFAULT_PRESET
    from analyzer.model.spec import ANALYSIS_MODE, BuildSpec
    from analyzer.report.catalog import load_shipped

    source = resolve_source(DEFAULT_PRESET)
    specs = [BuildSpec(source, v, "state", 4096, build_mode=ANALYSIS_MODE) for v in ("repeat_kv", "qfold")]
    for spec, result in zip(specs, run_builds(specs, tmp_path), strict=True):
        doc, shipped = load_analysis(result.path), load_shipped(spec.variant)
        assert doc.bytes_per_token == shipped.bytes_per_token, spec.variant
        assert doc.bytes_by_layer == shipped.bytes_by_layer, spec.variant
        assert doc.summary.op_counts == shipped.summary.op_counts, spec.variant
