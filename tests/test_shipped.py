"""The shipped full-size analyses of the default preset (what the dashboard shows on first open): the
write-up's figures, a weight count made independently from the config, agreement with a structure-scale build
regenerated here, and the comparison that ``make shipped``'s full test holds regenerated files to."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from analyzer.analysis.record import SCHEMA_VERSION, load_analysis, read_analysis_file
from analyzer.compare.diff import figure_differences
from analyzer.model.sources import DEFAULT_PRESET, load_config, resolve_source
from analyzer.report.catalog import SHIPPED_DIR, shipped_files, shipped_name


def _shipped(variant, compression=None, q_len=None):
    path = SHIPPED_DIR / shipped_name(DEFAULT_PRESET, variant, "state", 4096, compression, q_len)
    assert path.is_file(), f"missing shipped analysis {path.name}"
    return read_analysis_file(path)


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


def test_every_shipped_file_loads_as_the_current_schema():
    """The shipped files are schema 2 (full-size conversions made them; ``make shipped`` regenerates them as the
    current schema): each is migrated on load, and is sized (static shapes, every copy with a size and a verdict)."""
    files = shipped_files()
    assert {(s.variant, s.compression, s.phase) for s in files} == {
        ("repeat_kv", None, "decode"), ("qfold", None, "decode"), ("repeat_kv", "top8", "decode"),
        ("qfold", "top8", "decode"), ("repeat_kv", None, "prefill"), ("qfold", None, "prefill")}
    for s in files:
        doc = json.loads(s.path.read_text())
        assert doc["schema_version"] in (2, SCHEMA_VERSION), s.path.name
        a = read_analysis_file(s.path)
        assert a.migrated_from == (None if doc["schema_version"] == SCHEMA_VERSION else 2) and a.build is not None
        assert a.sizing.sized and a.summary.unsized_copies == 0 and a.program.sizing_error is None, s.path.name
        assert (a.build.spec.variant, a.build.spec.kv_mode, a.build.spec.ctx) == (s.variant, s.kv_mode, s.ctx)
        assert (a.build.spec.phase, a.build.spec.q_len) == (s.phase, s.q_len)
        assert a.build.spec.source.label == s.preset
        assert (a.build.spec.compression is None) == (s.compression is None)
        assert s.path.stat().st_size < 5 * 2**20  # no weights, no package
        assert a.program.path == "model.mlpackage"


def test_shipped_analyses_show_the_writeups_graph(shipped):
    a, b = shipped["repeat_kv"], shipped["qfold"]
    assert a.build.geometry.hidden_size == 2048 and a.build.geometry.vocab_size == 102400
    assert a.summary.tile_count == 60 and b.summary.tile_count == 0
    assert a.summary.tile_output_bytes == 1_006_632_960
    assert a.bytes_per_token.replication == 2_013_265_920
    assert a.bytes_per_token.total - b.bytes_per_token.total == 2_013_265_920


def test_fp16_weights_equal_an_independent_parameter_count(shipped):
    cfg = load_config(resolve_source(DEFAULT_PRESET))
    expected = _param_bytes_read_per_token(cfg)
    for variant in ("repeat_kv", "qfold"):
        assert shipped[variant].bytes_per_token.weights == expected, variant


def test_weight_bytes_are_traceable_to_their_ops(shipped):
    analysis = shipped["qfold"]
    ops = analysis.account.ops
    assert sum(o.weights for o in ops) == analysis.bytes_per_token.weights
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
        full, small = shipped[variant], load_analysis(path)
        strip = lambda counts: {k: n for k, n in counts.items() if k not in ("const", "cast")}  # noqa: E731
        assert strip(small.summary.op_counts) == strip(full.summary.op_counts), variant
        assert [replace(t, name="") for t in small.summary.tiles] == [replace(t, name="") for t in full.summary.tiles]
        for category in ("kv_read", "kv_write", "replication", "kv_write_value_semantics"):
            assert small.bytes_per_token.get(category) == full.bytes_per_token.get(category)


@pytest.mark.conversion
def test_figure_comparison_passes_for_the_same_build_and_fails_for_another(structure_builds, tmp_path):
    """The comparison ``make shipped``'s full test uses (graph.diff.figure_differences): a build read twice, and a
    build rewritten through the v2 file format, agree; the other variant and a changed op do not."""
    a = load_analysis(structure_builds["repeat_kv"])
    (tmp_path / "a.json").write_text(json.dumps(a.to_json()))
    assert figure_differences(a, load_analysis(structure_builds["repeat_kv"])) == ()
    assert figure_differences(a, read_analysis_file(tmp_path / "a.json")) == ()
    other = figure_differences(a, load_analysis(structure_builds["qfold"]))
    assert any(line.startswith("op count tile: 60 → 0") for line in other), other
    assert any(line.startswith("bytes per token replication") for line in other)


def test_figure_comparison_on_a_shipped_file(shipped):
    a = shipped["repeat_kv"]
    again = read_analysis_file(a.file)
    assert figure_differences(a, again) == ()
    ops = list(again.program.ops)
    tile = next(op for op in ops if op.type == "tile")
    ops[tile.index] = replace(tile, tile_kind="other")  # one tile no longer counted as KV replication
    changed = replace(again, program=replace(again.program, ops=tuple(ops)))
    lines = figure_differences(a, changed)
    assert any("tiles" in line for line in lines) and any("replication" in line for line in lines), lines
    assert figure_differences(a, a.with_weight_charge("decompressed")) == ()  # fp16: no compressed weight


def test_shipped_top8_changes_only_the_weight_bytes(shipped):
    for variant in ("repeat_kv", "qfold"):
        top8 = _shipped(variant, "top8")
        dense, small = shipped[variant].bytes_per_token, top8.bytes_per_token
        for category in ("kv_read", "kv_write", "replication"):
            assert small.get(category) == dense.get(category), (variant, category)
        # coremltools.optimize re-runs its pass pipeline and leaves two extra copies of the gather's
        # negative-index fix-up (greater_equal/add/select on one int32): 52 bytes
        assert abs(small.activations - dense.activations) < 1024
        assert small.weights < dense.weights / 2
        report = top8.compression
        assert report.compressed_count == 30 * 7 + 2  # every projection, the embedding and lm_head (untied)
        assert top8.build.untied_embeddings is True
        # the preset's assumed attention precision, read back from the graph
        assert report.precision_text("attn") == "int8 in layers 0-3,26-29; pal4 in layers 4-25"


def test_weight_charge_is_a_stated_option_of_the_account(shipped):
    top8 = _shipped("qfold", "top8")
    stored, dense = top8.bytes_per_token, top8.with_weight_charge("decompressed").bytes_per_token
    assert top8.account.weight_charge == "compressed"
    # decompressed at load: every compressed weight is read at its dense fp16 size (the embedding: one row)
    assert dense.weights == shipped["qfold"].bytes_per_token.weights
    assert stored.weights < dense.weights
    assert (stored.kv_read, stored.replication) == (dense.kv_read, dense.replication)


def test_shipped_names_follow_the_catalog():
    for s in shipped_files():
        q_len = s.q_len if s.phase == "prefill" else None
        assert s.path.name == shipped_name(s.preset, s.variant, s.kv_mode, s.ctx, s.compression, q_len)
    assert Path(SHIPPED_DIR).is_dir()


def test_shipped_prefill_pair_folds_without_rank_5_and_costs_the_decode_flops_per_prompt_token(shipped):
    """Full-size EXAONE prefill of 64 prompt tokens per call: repeat_kv keeps its 60 tiles (the same 16 MiB each:
    the whole static cache is replicated once per call), Q-fold has none and no op of rank > 4; per prompt token
    the matmuls cost what a decode token's do, except the lm_head (the last row only: ÷ 64)."""
    rkv, qf = _shipped("repeat_kv", q_len=64), _shipped("qfold", q_len=64)
    assert (rkv.call.phase, rkv.call.tokens_per_call) == ("prefill", 64)
    assert rkv.summary.kv_replication_tiles == 60 and rkv.summary.tile_output_bytes == 1_006_632_960
    assert qf.summary.kv_replication_tiles == 0
    assert max(len(t.shape) for op in qf.program.ops for t in op.outputs) == 4
    assert rkv.bytes_per_token.replication - qf.bytes_per_token.replication == 2_013_265_920  # the copies, per call
    # Q-fold's mask has G·N rows for the merged axis: each layer's mask add reads G × the [1,1,64,4096] fp16 rows,
    # and the one mask tile reads the host's mask and writes the G·N rows: +49.8 MB, 2.5% of the copies removed
    g, n, s = 4, 64, 4096
    extra = qf.bytes_per_token.activations - rkv.bytes_per_token.activations
    assert extra == 30 * (g - 1) * n * s * 2 + n * s * 2 + g * n * s * 2 == 49_807_360
    decode = shipped["qfold"].flops.per_token()
    for a in (rkv, qf):
        f = a.flops.per_token()
        assert (f.projections, f.ffn, f.attention_scores) == (decode.projections, decode.ffn, decode.attention_scores)
        assert f.lm_head == round(decode.lm_head / 64)
    assert rkv.build.equivalence.phase == "prefill" and rkv.build.equivalence.steps == 128
