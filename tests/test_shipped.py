"""The shipped full-size analyses of the default preset (what the dashboard shows on first open):
the write-up's figures, a weight count made independently from the config, and agreement with a
structure-scale build regenerated here."""

import json
from pathlib import Path

import pytest

from analyzer.graph.record import load_program
from analyzer.model.sources import DEFAULT_PRESET, load_config, resolve_source

SHIPPED = Path(__file__).resolve().parent.parent / "analyzer" / "shipped"


def _shipped(variant):
    path = SHIPPED / f"{DEFAULT_PRESET}-{variant}-state-ctx4096.analysis.json"
    assert path.is_file(), f"missing shipped analysis {path.name}"
    return load_program(path)


def _param_bytes_read_per_token(cfg) -> int:
    """fp16 parameter bytes one decode token reads, counted from the config alone (EXAONE 4 layout:
    q/k/v/o and gate/up/down projections without bias, per-head q/k RMSNorm, post-attention and
    post-feed-forward RMSNorm per layer, a final norm, tied embedding/lm_head)."""
    h, i, v, n = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size, cfg.num_hidden_layers
    hq, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    per_layer = h * hq * d + 2 * h * hkv * d + hq * d * h + 3 * h * i + 2 * d + 2 * h
    embedding_row = h  # the gather reads one row of the tied table
    lm_head = v * h  # ... and the lm_head linear reads all of it
    final_norm = h
    rope_inv_freq = d // 2  # the rotary embedding's inverse frequencies (a buffer, not a parameter)
    return 2 * (n * per_layer + embedding_row + lm_head + final_norm + rope_inv_freq)


@pytest.fixture(scope="module")
def shipped():
    return {v: _shipped(v) for v in ("repeat_kv", "qfold")}


def test_shipped_analyses_show_the_writeups_graph(shipped):
    a, b = shipped["repeat_kv"][1], shipped["qfold"][1]
    assert a["geometry"]["hidden_size"] == 2048 and a["geometry"]["vocab_size"] == 102400
    assert a["summary"]["tile_count"] == 60 and b["summary"]["tile_count"] == 0
    assert a["summary"]["tile_output_bytes"] == 1_006_632_960
    assert a["bytes"]["bytes_per_token"]["replication"] == 2_013_265_920
    assert a["bytes"]["bytes_per_token"]["total"] - b["bytes"]["bytes_per_token"]["total"] == 2_013_265_920


def test_fp16_weights_equal_an_independent_parameter_count(shipped):
    cfg = load_config(resolve_source(DEFAULT_PRESET))
    expected = _param_bytes_read_per_token(cfg)
    for variant in ("repeat_kv", "qfold"):
        assert shipped[variant][1]["bytes"]["bytes_per_token"]["weights"] == expected, variant


def test_weight_bytes_are_traceable_to_their_ops(shipped):
    from analyzer.graph.accounting import account

    program, doc = shipped["qfold"]
    ops = account(program).ops
    assert sum(o.weights for o in ops) == doc["bytes"]["bytes_per_token"]["weights"]
    linears = [o for o in ops if o.type == "linear"]
    assert len(linears) == 30 * 7 + 1  # 7 projections a layer + lm_head
    lm_head = max(linears, key=lambda o: o.weights)
    assert lm_head.weights == 102400 * 2048 * 2 and lm_head.layer is None


@pytest.mark.conversion
def test_structure_build_regenerates_the_shipped_graph(shipped, structure_builds):
    """Same layers and attention geometry at small hidden/vocab sizes: the same graph, op for op, the same
    tiles and the same KV bytes. Two counts legitimately differ: const (deduplication depends on the
    values) and cast (coremltools narrows the token ids to int16 when the vocabulary fits, 1,000 < 32,768)."""
    for variant, path in structure_builds.items():
        full = shipped[variant][1]
        small = load_program(path)[1]
        strip = lambda counts: {k: n for k, n in counts.items() if k not in ("const", "cast")}  # noqa: E731
        assert strip(small["summary"]["op_counts"]) == strip(full["summary"]["op_counts"]), variant
        for t_full, t_small in zip(full["summary"]["tiles"], small["summary"]["tiles"], strict=True):
            assert {k: t_full[k] for k in ("layer", "input_shape", "output_shape", "dtype", "output_bytes", "kind")} \
                == {k: t_small[k] for k in ("layer", "input_shape", "output_shape", "dtype", "output_bytes", "kind")}
        for category in ("kv_read", "kv_write", "replication", "kv_write_value_semantics"):
            assert small["bytes"]["bytes_per_token"][category] == full["bytes"]["bytes_per_token"][category]


def test_shipped_files_are_small_and_hold_no_weights():
    for f in SHIPPED.glob("*.json"):
        assert f.stat().st_size < 5 * 2**20, f.name
        doc = json.loads(f.read_text())
        assert doc["program"]["path"] == "model.mlpackage"


def test_shipped_top8_changes_only_the_weight_bytes(shipped):
    for variant in ("repeat_kv", "qfold"):
        path = SHIPPED / f"{DEFAULT_PRESET}-{variant}-state-ctx4096-top8.analysis.json"
        _, top8 = load_program(path)
        dense, small = shipped[variant][1]["bytes"]["bytes_per_token"], top8["bytes"]["bytes_per_token"]
        for category in ("kv_read", "kv_write", "replication"):
            assert small[category] == dense[category], (variant, category)
        # coremltools.optimize re-runs its pass pipeline and leaves two extra copies of the gather's
        # negative-index fix-up (greater_equal/add/select on one int32): 52 bytes
        assert abs(small["activations"] - dense["activations"]) < 1024
        assert small["weights"] < dense["weights"] / 2
        report = top8["compression_report"]
        assert report["compressed_count"] == 30 * 7 + 2  # every projection, the embedding and lm_head (untied)
        assert top8["untied_embeddings"] is True
