"""Core AI builds and walks (issue 19, conversion and walking), on real conversions of tiny configs.

One child converts the tiny default config (2 layers, 32/8 heads, head_dim 64, ctx 256) to Core AI with the three
variants (conftest ``coreai_builds``); the session's Core ML tiny pair (conftest) is the fp16 reference. Every
GQA/MQA preset's own family and geometry: tests/test_coreai_presets.py.
"""

import csv
import hashlib
import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("coreai_torch")  # Core AI's wheels: Linux x86_64 cp311/cp312 and macOS arm64 only
import coreai.authoring  # noqa: F401  (before coreai._compiler.dialects: the other order is a circular import)

from analyzer.analysis.record import Analysis, load_analysis
from analyzer.cli import main as cli
from analyzer.compare.diff_reasons import explain
from analyzer.convert.launch import run_builds
from analyzer.errors import AimodelError, QfoldError
from analyzer.ir.coreai.asset import check_asset
from analyzer.ir.coreai.walk import read_asset
from analyzer.jsonfields import Field
from analyzer.model.cost import estimate
from analyzer.model.decode import DecodeStep, build_model, example_inputs, make_mask, run_decode
from analyzer.model.linear_layout import TransposedLinear, pretranspose_linears_
from analyzer.model.sources import DEFAULT_PRESET, geometry_of, load_config, resolve_source
from analyzer.model.spec import BuildSpec
from analyzer.report.catalog import catalog, spec_facts
from analyzer.report.compare import compare
from analyzer.report.labels import match_log_label
from tests.conftest import COREAI_VARIANTS, TINY_CTX, TINY_OVERRIDES, coreai_specs
from tests.coreai_assets import foreign_asset
from tests.test_fast_identity import assert_same_analysis

pytestmark = pytest.mark.conversion
VARIANTS = COREAI_VARIANTS
SAME_BYTES = ("kv_read", "kv_write", "replication", "kv_write_value_semantics")


def fp32_spec() -> BuildSpec:
    return BuildSpec(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES), "qfold", "state", TINY_CTX, backend="coreai",
                     weights="fp32")


INPUT_AND_PREFILL = {"input": dict(kv_mode="input"), "prefill": dict(kv_mode="state", phase="prefill", q_len=8)}


def input_and_prefill_specs() -> list[BuildSpec]:
    """KV as inputs and a prefill of 8 tokens, analysis mode, on each backend (Core ML, Core AI in turn)."""
    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    return [BuildSpec(source, "repeat_kv", ctx=TINY_CTX, build_mode="analysis", backend=b, **kw)
            for kw in INPUT_AND_PREFILL.values() for b in ("coreml", "coreai")]


def analysis_sdpa_spec() -> BuildSpec:
    return BuildSpec(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES), "sdpa_gqa", "state", TINY_CTX,
                     build_mode="analysis", backend="coreai")


@pytest.fixture(scope="module", autouse=True)
def _one_child_for_the_modules_builds(builds_root):
    """Every build this module asks for (conftest's three Core AI variants, the fp32 one, the analysis-mode ones)
    requested at once, so one child converts them (each test's own ``run_builds`` then finds its build); builds that
    another test file made already are reused."""
    run_builds([*coreai_specs(), fp32_spec(), *input_and_prefill_specs(), analysis_sdpa_spec()], builds_root)


def kv_copies(a: Analysis):
    return [t for t in a.summary.tiles if t.kind == "kv_replication"]


def test_coreai_replication_per_variant(coreai_builds):
    g = geometry_of(load_config(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)))
    per_copy = g.num_q_heads * TINY_CTX * g.head_dim * 2  # Hq·S·D·2 bytes
    rk, qf, sd = (load_analysis(coreai_builds[v]) for v in VARIANTS)
    assert rk.program.backend == "coreai" and rk.build.spec.backend == "coreai" and rk.build.spec.weights == "fp16"
    assert (coreai_builds["repeat_kv"] / "model.aimodel" / "main.mlirb").is_file()
    copies = kv_copies(rk)
    assert [t.layer for t in copies] == [0, 0, 1, 1]  # 2 per layer
    assert {t.op_type for t in copies} == {"coreai.broadcast_in_dims"}
    assert {t.output_bytes for t in copies} == {per_copy}
    assert all(t.composite is None for t in copies)
    assert kv_copies(qf) == [] and qf.bytes_per_token.replication == 0
    inside = kv_copies(sd)  # the SDPA composite's fallback body, inlined once per call
    assert [t.layer for t in inside] == [0, 0, 1, 1] and {t.op_type for t in inside} == {"coreai.tile"}
    assert {t.composite for t in inside} == {"scaled_dot_product_attention"} and {t.output_bytes for t in inside} == {
        per_copy}
    invokes = [op for op in sd.program.ops if op.type == "coreai.invoke"]
    assert len(invokes) == g.num_layers
    assert {sd.program.ops[i].parent for i in (op.index for op in sd.program.ops if op.composite)} == {
        op.index for op in invokes}
    assert rk.bytes_per_token.replication == sd.bytes_per_token.replication == 2 * 2 * g.num_layers * per_copy


@pytest.mark.parametrize("variant", ["repeat_kv", "qfold"])
def test_coreai_bytes_equal_coreml_and_diff_explains_the_rest(coreai_builds, tiny_builds, variant, capsys):
    ml, ai = load_analysis(tiny_builds[variant]), load_analysis(coreai_builds[variant])
    for k in SAME_BYTES:
        assert ml.bytes_per_token.get(k) == ai.bytes_per_token.get(k), k
    reasons = explain(ml, ai)
    for category in ("weights", "activations", "replication"):
        parts = [r for r in reasons if r.aspect == category]
        assert sum(r.delta for r in parts) == ai.bytes_per_token.get(category) - ml.bytes_per_token.get(category)
    assert_causes_read_off_the_graphs(reasons, ml, ai)
    # weights: the same parameters; what differs is only what each converter makes a constant, each with its cause
    weights = {r.kind: r for r in reasons if r.aspect == "weights"}
    assert all("constants" in r.why for r in weights.values()), weights
    g = geometry_of(load_config(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)))
    half = g.head_dim // 2  # RoPE's inverse frequencies: fp16 in Core ML, fp32 (torch's dtype) in Core AI
    assert f"read the constants: A fp16 [{half}] where B fp32 [{half}]" in weights["mul"].why, weights["mul"].why
    assert ai.bytes_per_token.weights - ml.bytes_per_token.weights == g.head_dim + 12  # fp32 inv_freq; INT32_MAX×3
    assert ml.flops.per_token().get("projections") == ai.flops.per_token().get("projections") > 0
    assert ml.flops.per_token().get("attention_scores") == ai.flops.per_token().get("attention_scores")
    assert cli(["diff", str(tiny_builds[variant]), str(coreai_builds[variant]), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backends"] == {"a": "coreml", "b": "coreai"}
    assert all(r["why"] for r in doc["reasons"]) and {r["aspect"] for r in doc["reasons"]} >= {"weights", "ops"}


def assert_causes_read_off_the_graphs(reasons, a: Analysis, b: Analysis) -> None:
    """Every byte part's cause describes the two graphs' ops of its kind and names an op of each side that has
    them, and those ops are there, of that kind (a cause is read off the graphs, never looked up)."""
    for r in reasons:
        if r.aspect == "ops":
            continue
        named = re.findall(r"\b([AB])'s '([^']+)'", r.why)
        assert named and (r.a == 0 or "A" in dict(named)) and (r.b == 0 or "B" in dict(named)), r
        for side, name in named:
            program = (a if side == "A" else b).program
            assert any(op.name == name and op.kind == r.kind for op in program.ops), (r, side, name)


def test_coreai_inspect_graph_and_labels(coreai_builds, tiny_builds, capsys, tmp_path):
    asset = coreai_builds["sdpa_gqa"] / "model.aimodel"
    assert cli(["inspect", str(asset), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"] == "coreai" and doc["function"] == "main" and doc["unruled_op_types"] == []
    assert doc["bytes_per_token"] == load_analysis(coreai_builds["sdpa_gqa"]).bytes_per_token.to_json()
    assert [t["composite"] for t in doc["tiles"] if t["kind"] == "kv_replication"] == [
        "scaled_dot_product_attention"] * 4
    out = tmp_path / "l0.dot"
    assert cli(["graph", str(tiny_builds["repeat_kv"]), str(coreai_builds["repeat_kv"]), "--layer", "0",
                "--out", str(out)]) == 0
    assert "coreai.broadcast_in_dims" in out.read_text()
    a = load_analysis(coreai_builds["qfold"])
    assert spec_facts(a.build.spec).label().endswith("KV state · Core AI")
    assert spec_facts(load_analysis(tiny_builds["qfold"]).build.spec).label().endswith("KV state")
    diffs = compare(load_analysis(tiny_builds["repeat_kv"]), a).differences
    assert [(d.aspect, d.a, d.b) for d in diffs] == [("backend", "Core ML", "Core AI")]


def test_bad_assets_are_one_line_errors(coreai_builds, tiny_builds, tmp_path, capsys):
    good = coreai_builds["qfold"] / "model.aimodel"
    assert check_asset(good) == good

    def copy(name: str) -> Path:
        return Path(shutil.copytree(good, tmp_path / name))

    truncated = copy("truncated.aimodel")
    with (truncated / "main.mlirb").open("r+b") as f:
        f.truncate(4096)
    no_hash = copy("nohash.aimodel")
    (no_hash / "main.hash").unlink()
    not_mlir = copy("notmlir.aimodel")
    (not_mlir / "main.mlirb").write_bytes(b"PK\x03\x04 not bytecode")
    bad_meta = copy("badmeta.aimodel")
    (bad_meta / "metadata.json").write_text("{nope")
    renamed = Path(shutil.copytree(tiny_builds["qfold"] / "model.mlpackage", tmp_path / "renamed.aimodel"))
    a_file = tmp_path / "file.aimodel"
    a_file.write_text("x")
    cases = {truncated: "SHA-256", no_hash: "main.hash", not_mlir: "not MLIR bytecode", bad_meta: "not valid JSON",
             renamed: ".mlpackage", a_file: "directory", tmp_path / "missing.aimodel": "no such"}
    for path, why in cases.items():
        with pytest.raises(AimodelError) as e:
            check_asset(path)
        assert why in str(e.value) and "\n" not in str(e.value), path
    scrambled = copy("scrambled.aimodel")  # passes every check (hash rewritten): the native reader fails, in its child
    data = bytearray((scrambled / "main.mlirb").read_bytes())
    for i in range(200, 5000, 7):
        data[i] ^= 0x5A
    (scrambled / "main.mlirb").write_bytes(bytes(data))
    (scrambled / "main.hash").write_bytes(hashlib.sha256(data).digest())
    with pytest.raises(AimodelError) as e:
        read_asset(scrambled)
    assert str(scrambled) in str(e.value) and "\n" not in str(e.value)
    assert cli(["inspect", str(renamed)]) == 1  # the CLI: one line, no traceback, never handed to the runtime
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Core ML .mlpackage" in err


def test_backend_refusals_and_keys():
    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    ml = BuildSpec(src, "qfold", "state", TINY_CTX)
    assert "backend" not in ml.fingerprint() and "coreml" not in ml.key  # Core ML keys as before backends
    ai = BuildSpec(src, "qfold", "state", TINY_CTX, backend="coreai")
    assert ai.key.rsplit("-", 2)[1] == "coreai" and ai.key != ml.key
    fp32 = replace(ai, weights="fp32")
    assert fp32.key.rsplit("-", 3)[1:3] == ["coreai", "fp32"]
    assert "-ctx256-analysis-coreai-" in replace(ai, build_mode="analysis").key
    for bad, why in ((dict(variant="sdpa_gqa"), "enable_gqa"), (dict(weights="fp32"), "fp16"),
                     (dict(backend="coreai", compression="ffn=pal4", build_mode="analysis"), "coreai-opt computes"),
                     (dict(backend="coreai", phase="decode+prefill", q_len=4), "one function"),
                     (dict(backend="coreai", weights="fp32", build_mode="analysis"), "fp16 views"),
                     (dict(backend="metal"), "choose one of")):
        with pytest.raises(QfoldError, match=why):
            BuildSpec(**{**dict(source=src, variant="qfold", kv_mode="state", ctx=TINY_CTX), **bad})
    full = load_config(resolve_source(DEFAULT_PRESET))  # the cost model knows Core AI's memory (the measured build)
    rows = json.loads((Path(__file__).parents[1] / "bench/results/cost_model.json").read_text())["rows"]
    fp16 = estimate(full, 4096, "materialised", "coreai", "fp16")
    measured = rows["coreai-mat-exaone-qfold"]["peak_rss_tree_bytes"]
    assert abs(fp16.peak_rss_bytes / measured - 1) <= fp16.error  # within the error it states
    fp32 = estimate(full, 4096, "materialised", "coreai", "fp32").peak_rss_bytes
    assert fp32 > fp16.peak_rss_bytes + fp16.weight_bytes_fp16  # fp32 weights: twice the bytes held
    doc = ml.to_json()
    del doc["backend"], doc["weights"]  # an analysis written before backends existed
    old = BuildSpec.from_json(Field(doc, "old"))
    assert (old.backend, old.weights) == ("coreml", "fp16")


def test_sdpa_gqa_matches_repeat_kv_and_the_core_ml_trace_is_unchanged():
    """sdpa_gqa computes repeat_kv's function (fp32, both KV modes); the export-only cache write leaves a
    torch.jit.trace (the Core ML route) writing the slot of the call, not the traced position."""
    model = build_model(resolve_source(DEFAULT_PRESET, [*TINY_OVERRIDES, "vocab_size=128"]), torch.float32)
    tokens = [3, 17, 5, 99, 42]
    for kv in ("state", "input"):
        ref = run_decode(DecodeStep(model, 16, "repeat_kv", kv), tokens, torch.float32)
        got = run_decode(DecodeStep(model, 16, "sdpa_gqa", kv), tokens, torch.float32)
        assert (ref - got).abs().max() < 1e-4 and torch.equal(ref.argmax(-1), got.argmax(-1)), kv
    step = DecodeStep(model, 16, "qfold", "state").eval()
    with torch.no_grad():
        traced = torch.jit.trace(step, example_inputs(step), check_trace=False)
        step.reset()
        traced(torch.tensor([[3]], dtype=torch.int32), torch.tensor([5], dtype=torch.int32),
               make_mask(16, 5, torch.float32, True))
    assert step.k_cache_0[0, :, 5].abs().sum() > 0 and step.k_cache_0[0, :, 0].abs().sum() == 0


def test_fold_bench_and_shape_on_core_ai_builds(coreai_builds, tmp_path, capsys):
    """A Core AI build folder is folded like its asset; bench logs a build under the build's label (which maps back
    to it); a --shape an asset cannot take is refused, never ignored; fold's help names both backends."""
    folder = coreai_builds["repeat_kv"]
    assert cli(["fold", str(folder), str(tmp_path / "f.aimodel"), "--json", "--steps", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"] == "coreai" and doc["tiles_folded"] == 4 and doc["proof"]["bit_identical"]
    assert doc["input"] == str(folder / "model.aimodel") and check_asset(tmp_path / "f.aimodel")
    assert cli(["fold", str(folder), str(folder / "inside.aimodel")]) == 1
    assert "inside the input" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["fold", "--help"])
    helptext = " ".join(capsys.readouterr().out.split())
    assert ".aimodel" in helptext and "Core AI runtime" in helptext

    asset = coreai_builds["qfold"] / "model.aimodel"
    for argv in (["inspect", str(asset)], ["run", str(asset), "--steps", "1", "--out", str(tmp_path / "o.npz")],
                 ["fold", str(asset), str(tmp_path / "g.aimodel")]):
        assert cli([*argv, "--shape", "input_ids=1,4"]) == 1, argv
        err = capsys.readouterr().err
        assert "static input shapes" in err and "[1, 1]" in err and err.count("\n") == 1, err
    assert cli(["inspect", str(asset), "--shape", "input_ids=1,1"]) == 0  # its own shape: nothing to refuse

    log = tmp_path / "log.csv"
    capsys.readouterr()
    assert cli(["bench", str(coreai_builds["qfold"]), "--steps", "1", "--rounds", "1", "--warmup", "0",
                "--out", str(log)]) == 0
    (row,) = list(csv.DictReader(log.open()))
    refs = catalog()
    ref = next(r for r in refs if r.id == f"build:{coreai_builds['qfold'].name}")
    assert row["build"] == ref.label and ref.label.endswith(f"Core AI · build {ref.id.rsplit('-', 1)[1]}")
    assert match_log_label(row["build"], refs).ref_id == ref.id


def test_linear_weights_are_stored_as_the_matmul_reads_them(coreai_builds):
    """analyzer.model.linear_layout: every untied linear stored [in, out] computes what nn.Linear did (a real
    model's decode, fp32), the tied lm_head keeps its layout, and the Core AI build runs no transpose of a weight
    but the tied lm_head's: K's transposes for QKᵀ (one per layer) and that one are all that is left."""
    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    g = geometry_of(load_config(src))
    model = build_model(src, torch.float32)
    fp32_step = dict(variant="qfold", kv_mode="state", cache_dtype=torch.float32)  # an fp16 cache would round
    ref = run_decode(DecodeStep(model, TINY_CTX, **fp32_step), [5, 7, 11], torch.float32)
    assert pretranspose_linears_(model) == 7 * g.num_layers  # q, k, v, o, gate, up, down; lm_head is tied
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight is model.get_input_embeddings().weight
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, TransposedLinear) and q.weight_t.shape == (g.hidden_size, g.num_q_heads * g.head_dim)
    got = run_decode(DecodeStep(model, TINY_CTX, **fp32_step), [5, 7, 11], torch.float32)
    assert (got - ref).abs().max() < 1e-5 * max(ref.abs().max(), 1)  # the same products, summed in another order
    for variant in ("repeat_kv", "qfold"):
        ops = load_analysis(coreai_builds[variant]).program.ops
        transposes = [op for op in ops if op.type == "coreai.transpose"]
        from_constants = [op for op in transposes if any(i.is_const and len(i.tensor.shape) == 2 for i in op.inputs)]
        assert len(transposes) == g.num_layers + 1 and len(from_constants) == 1, variant  # K per layer, lm_head


def test_an_fp32_build_keeps_its_kv_state_in_fp32(coreai_builds, builds_root):
    """``--weights fp32`` on Core AI: the cache is fp32 like the rest of the model (``BuildSpec.kv_dtype``), so no
    cast reads a state (an fp16 cache cost two whole-cache casts per layer and step), the KV bytes are twice the fp16
    build's, and the key says so where an fp16 build's key is unchanged."""
    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    spec = fp32_spec()
    assert spec.kv_dtype == "fp32" and spec.fingerprint()["kv_dtype"] == "fp32"
    assert replace(spec, weights="fp16").fingerprint()["kv_dtype"] == "fp16" == BuildSpec(src, "qfold").kv_dtype
    (built,) = run_builds([spec], builds_root)
    fp32, fp16 = load_analysis(built.path), load_analysis(coreai_builds["qfold"])
    assert {t.dtype for t in fp32.program.states} == {"fp32"} and {t.dtype for t in fp16.program.states} == {"fp16"}
    ops = fp32.program.ops
    reads = {op.index for op in ops if op.type == "coreai.read_handle"}
    assert reads and not [op for op in ops if op.type == "coreai.cast" and
                          any(i.producer in reads for i in op.inputs)]
    assert fp32.bytes_per_token.kv_read == 2 * fp16.bytes_per_token.kv_read > 0
    cost = {w: estimate(load_config(src), TINY_CTX, "materialised", "coreai", w).kv_state_bytes
            for w in ("fp16", "fp32")}
    assert cost["fp16"] == sum(t.nbytes for t in fp16.program.states) and cost["fp32"] == 2 * cost["fp16"]


def test_input_mode_and_prefill_builds_match_core_ml(builds_root):
    """KV as inputs (new_k/new_v outputs) and a prefill step of 8 tokens, analysis mode, against the Core ML build of
    the same spec: the copies and every KV byte category agree."""
    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    cases = INPUT_AND_PREFILL
    got = [load_analysis(r.path) for r in run_builds(input_and_prefill_specs(), builds_root)]
    g = geometry_of(load_config(source))
    for (case, kw), ml, ai in zip(cases.items(), got[0::2], got[1::2], strict=True):
        assert ai.program.backend == "coreai" and ai.build.spec.backend == "coreai", case
        q = kw.get("q_len", 1)
        assert ai.call.phase == ("prefill" if q > 1 else "decode") and ai.call.tokens_per_call == q, case
        copies = sorted(t.output_bytes for t in kv_copies(ai))
        assert copies == sorted(t.output_bytes for t in kv_copies(ml)), case
        cache, new = g.num_q_heads * TINY_CTX * g.head_dim * 2, g.num_q_heads * g.head_dim * 2  # Hq·S·D·2, Hq·1·D·2
        # K and V per layer; KV as inputs, the new token's K and V too (as in the Core ML build: test_fold_presets)
        per_layer = [cache, cache] + ([new, new] if case == "input" else [])
        assert copies == sorted(per_layer * g.num_layers), case
        for k in SAME_BYTES:
            assert ml.bytes_per_token.get(k) == ai.bytes_per_token.get(k), (case, k)
    io = {t.name for t in got[1].program.inputs}
    assert {"input_ids", "current_pos", "causal_mask", "k_cache_0", "v_cache_1"} <= io and not got[1].program.states
    assert {t.name for t in got[1].program.outputs} == {"logits", "new_k", "new_v"}
    assert got[3].program.inputs[0].shape == (1, 8) and len(got[3].program.states) == 2 * g.num_layers


@pytest.fixture(scope="module")
def foreign(tmp_path_factory) -> Path:
    return foreign_asset(tmp_path_factory.mktemp("foreign") / "llama.aimodel")


def test_a_foreign_aimodel_is_walked(foreign, capsys):
    """An asset converted from a stock Hugging Face forward (not qfold's step): inspect finds its layers and
    transformers' repeat_kv copies (K and V per layer, fp32) and infers a prefill of 8 tokens."""
    asset = foreign
    capsys.readouterr()  # coreai-torch's progress line
    assert cli(["inspect", str(asset), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"] == "coreai" and doc["function"] == "main" and doc["phase"] == "prefill"
    assert doc["tokens_per_call"] == 8
    copies = [t for t in doc["tiles"] if t["kind"] == "kv_replication"]
    assert [t["layer"] for t in copies] == [0, 0, 1, 1]
    assert {(tuple(t["input_shape"]), tuple(t["output_shape"]), t["dtype"]) for t in copies} == {
        ((1, 2, 1, 8, 16), (1, 2, 2, 8, 16), "fp32")}
    assert doc["bytes_per_token"]["replication"] > 0 and doc["bytes_per_token"]["kv_read"] == 0  # no cache
    assert doc["unruled_op_types"] == ["coreai.scan"]  # HF's mask code: charged by the generic rule, and said


def test_a_foreign_aimodel_is_folded_and_proven_on_drawn_inputs(foreign, capsys, tmp_path):
    """No qfold input names, no input spec: the proof runs anyway, on inputs drawn within what each can hold
    (token ids below the embedding's rows), as a package's does, and the fold is proven (issue 37)."""
    capsys.readouterr()
    assert cli(["fold", str(foreign), str(tmp_path / "folded.aimodel"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["tiles_found"], doc["tiles_folded"], doc["output_written"]) == (4, 4, True)
    proof = doc["proof"]
    assert proof["status"] == "proven" and proof["roles"] == "random draws (no input spec)" and proof["steps"] == 4
    assert [d.split(":")[0] for d in proof["draws"]] == ["input_ids int32[1,8]"]
    assert "token ids uniform in [0, 128) (the rows of embedding" in proof["draws"][0]  # vocab 128, read off it


def test_analysis_mode_walks_as_the_materialised_build(coreai_builds, builds_root):
    """Value-free weights (analysis mode) give the materialised Core AI build's op records and bytes, op for op
    (sdpa_gqa: its composite body included); no asset is kept."""
    (result,) = run_builds([analysis_sdpa_spec()], builds_root)
    assert not (result.path / "model.aimodel").exists()
    assert_same_analysis(load_analysis(result.path).program, load_analysis(coreai_builds["sdpa_gqa"]).program)
