"""Core AI assets on Apple's Core AI runtime: run (CLI contract), fold (proof on the runtime), bench (a log fit
reads), and the cross-checks: runtime vs torch, MIL interpreter (Core ML build) vs runtime (Core AI build).

One module fixture converts the tiny config (2 layers of the default preset's attention geometry, 32 q / 8 KV heads,
head dim 64, ctx 256) from qfold's own decode step: repeat_kv, qfold and sdpa_gqa with fp32 weights, qfold with fp16
weights, and an fp32 Core ML package of the same repeat_kv step. The fp16 cross-check between the stacks runs on
qfold's own builds of both backends (conftest ``tiny_builds`` and ``coreai_builds``: the same model and seed).
"""

from __future__ import annotations

import csv
import hashlib
import json
import shutil

import numpy as np
import pytest

pytest.importorskip("coreai")  # the coreai-core wheel exists for Linux x86_64 and macOS arm64 only

import torch

from analyzer.analysis.accounting import CATEGORIES, account
from analyzer.cli import main
from analyzer.engines.coreai.runtime import FP16_TOLERANCE, FP32_TOLERANCE, CoreAIRuntime, OpTime, Profile
from analyzer.engines.interpret import decode_steps, load_interpreter
from analyzer.errors import AimodelError, CoreAIRuntimeError, FoldError
from analyzer.fold.coreai.asset_fold import fold_asset, kv_copies
from analyzer.ir.coreai import native_child
from analyzer.ir.coreai.op_ids import read_op_ids
from analyzer.ir.coreai.walk import read_asset
from analyzer.measure.bench import join_asset, join_profile
from analyzer.model.decode import run_decode
from tests.conftest import FOLD_REPORT_KEYS, TINY_CTX, TINY_OVERRIDES
from tests.coreai_assets import coreai_asset, coreml_fp32_package, make_step

STEPS = 4
TOKENS = [1, 7, 42, 99]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    d = tmp_path_factory.mktemp("coreai")
    out, refs = {}, {}
    for variant, dtype in (("repeat_kv", torch.float32), ("qfold", torch.float32), ("sdpa_gqa", torch.float32),
                           ("qfold", torch.float16)):
        step = make_step(variant, TINY_OVERRIDES, TINY_CTX, dtype)
        name = f"{variant}_{str(dtype).removeprefix('torch.')}"
        out[name] = coreai_asset(step, d / f"{name}.aimodel")
        refs[name] = run_decode(step, TOKENS, dtype).float().numpy()
        if name == "repeat_kv_float32":
            out["coreml_fp32"] = coreml_fp32_package(step, d / "repeat_kv_fp32.mlpackage")
    return out, refs


def _digest(asset) -> str:
    return hashlib.sha256((asset / "main.mlirb").read_bytes()).hexdigest()


def _runtime_logits(path, tokens=TOKENS):
    with CoreAIRuntime() as rt:
        run = decode_steps(rt.load(path), len(tokens), tokens=tokens)
    return np.stack([o["logits"].reshape(-1) for o in run.outputs]).astype(np.float32), run


# ------------------------------------------------------------------------------------------------ fold
def test_fold_of_repeat_kv_equals_the_qfold_build(assets, tmp_path):
    a, _ = assets
    src, before = a["repeat_kv_float32"], _digest(a["repeat_kv_float32"])
    report = fold_asset(src, tmp_path / "folded.aimodel", steps=STEPS)
    assert _digest(src) == before  # IN never touched
    assert (report.tiles_folded, len(report.decisions)) == (4, 4)  # 2 layers × K and V
    assert all(d.mapping == "h // G" and d.kv_heads == 8 and d.group == 4 for d in report.decisions)
    assert report.weights.ok and report.weights.identical == report.weights.checked > 0
    proof = report.proof
    assert proof.checked and proof.bit_identical and proof.steps >= 4 and "Core AI runtime" in proof.headline()
    assert {"logits", "k_cache_0", "v_cache_1"} <= set(proof.max_abs_diff)  # outputs and final states
    folded, original, qfold = (read_asset(p) for p in (tmp_path / "folded.aimodel", src, a["qfold_float32"]))
    assert (kv_copies(original), kv_copies(folded)) == (4, 0)
    assert account(folded).totals() == account(qfold).totals()
    f = report.functions[0]
    assert f.before["replication"] > 0 and f.after["replication"] == 0 and f.after["weights"] == f.before["weights"]


def test_fold_reaches_into_the_sdpa_composite_body(assets, tmp_path):
    a, _ = assets
    report = fold_asset(a["sdpa_gqa_float32"], tmp_path / "sdpa.aimodel", steps=STEPS)
    assert [d.name.split("#")[0] for d in report.decisions] == ["tile", "tile"]  # K and V, once in the body
    assert all(d.folded and "composite" in d.chain and "2 calls" in d.chain for d in report.decisions)
    assert report.proof.bit_identical and report.weights.ok
    f = report.functions[0]
    assert (f.kv_replication_tiles_before, f.kv_replication_tiles_after) == (4, 0)  # counted per composite call
    assert f.after["replication"] == 0 < f.before["replication"]


def test_fold_cli_json_and_nothing_to_fold(assets, tmp_path, capsys):
    a, _ = assets
    assert main(["fold", str(a["repeat_kv_float32"]), str(tmp_path / "f.aimodel"), "--json", "--steps", "4"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["backend"] == "coreai" and doc["tiles_folded"] == 4 and doc["proof"]["bit_identical"]
    assert set(doc) == {"input", "output", *FOLD_REPORT_KEYS, "proof", "output_written"}  # a package's, no cache
    assert main(["fold", str(a["qfold_float32"]), str(tmp_path / "q.aimodel")]) == 0
    assert "nothing to fold" in capsys.readouterr().out
    assert _digest(tmp_path / "q.aimodel") == _digest(a["qfold_float32"])  # a byte copy
    assert main(["fold", str(a["qfold_float32"]), str(a["qfold_float32"])]) == 1
    assert capsys.readouterr().err.count("\n") == 1


# ------------------------------------------------------------------------------------------------ run
def test_run_cli_contract(assets, tmp_path, capsys):
    a, refs = assets
    asset = a["repeat_kv_float32"]
    mask = np.full((1, 1, 1, TINY_CTX), -30000, np.float16)
    for pos, tok in enumerate(TOKENS[:2]):
        m = mask.copy()
        m[..., :pos + 1] = 0
        np.savez(tmp_path / f"in{pos}.npz", input_ids=np.array([[tok]], np.int32),
                 current_pos=np.array([pos], np.int32), causal_mask=m)
    assert main(["run", str(asset), "--inputs", str(tmp_path / "in0.npz"), "--out", str(tmp_path / "o0.npz")]) == 0
    assert main(["run", str(asset), "--inputs", str(tmp_path / "in1.npz"), "--out", str(tmp_path / "o1.npz"),
                 "--states", str(tmp_path / "o0.npz")]) == 0  # a previous OUT.npz chains as is
    with np.load(tmp_path / "o1.npz", allow_pickle=False) as o1:
        assert {"logits", "k_cache_0", "v_cache_0", "k_cache_1", "v_cache_1"} == set(o1.files)
        scale = np.abs(refs["repeat_kv_float32"]).max()
        assert np.abs(o1["logits"].reshape(-1) - refs["repeat_kv_float32"][1]).max() <= FP32_TOLERANCE * scale
        assert np.count_nonzero(np.abs(o1["k_cache_0"][0, 0]).sum(-1)) == 2  # two slots written
    assert main(["run", str(asset), "--steps", "3", "--out", str(tmp_path / "s.npz")]) == 0
    with np.load(tmp_path / "s.npz", allow_pickle=False) as s:
        assert s["logits"].shape == (3, 1, 1, 1000) and s["tokens"].shape == (3, 1)
    capsys.readouterr()
    np.savez(tmp_path / "bad.npz", input_ids=np.array([[1]], np.int32))
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    shutil.copy(tmp_path / "obj.npy", tmp_path / "obj.npz")
    for argv in (["--inputs", str(tmp_path / "bad.npz")], ["--inputs", str(tmp_path / "obj.npz")]):
        assert main(["run", str(asset), *argv, "--out", str(tmp_path / "x.npz")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err


def test_a_bad_asset_is_one_line_never_a_crash(assets, tmp_path, capsys):
    a, _ = assets
    fake = tmp_path / "renamed.aimodel"  # a Core ML package under a Core AI name
    shutil.copytree(a["coreml_fp32"], fake)
    edited = tmp_path / "edited.aimodel"  # a well-formed asset whose program bytes are garbage
    shutil.copytree(a["qfold_float32"], edited)
    data = bytearray((edited / "main.mlirb").read_bytes())
    data[4:204] = bytes(200)
    (edited / "main.mlirb").write_bytes(bytes(data))
    (edited / "main.hash").write_bytes(hashlib.sha256(bytes(data)).digest())
    for path, why in ((fake, "Core ML"), (edited, "Core AI runtime crashed")):
        assert main(["run", str(path), "--steps", "1", "--out", str(tmp_path / "x.npz")]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and why in err and str(path) in err


# ------------------------------------------------------------------------------------------------ cross-checks
def test_runtime_matches_torch_within_the_stated_tolerances(assets):
    a, refs = assets
    for name, tol in (("repeat_kv_float32", FP32_TOLERANCE), ("qfold_float32", FP32_TOLERANCE),
                      ("sdpa_gqa_float32", FP32_TOLERANCE), ("qfold_float16", FP16_TOLERANCE)):
        got, _ = _runtime_logits(a[name])
        ref = refs[name]
        assert np.abs(got - ref).max() <= tol * np.abs(ref).max(), name
    fp32, _ = _runtime_logits(a["qfold_float32"])
    fp16, _ = _runtime_logits(a["qfold_float16"])
    assert np.abs(fp16 - fp32).max() > FP32_TOLERANCE * np.abs(fp32).max()  # fp16 really needs its wider bound


def test_mil_interpreter_and_core_ai_runtime_agree_in_fp32(assets):
    a, _ = assets
    got, core_ai = _runtime_logits(a["repeat_kv_float32"])
    run = decode_steps(load_interpreter(a["coreml_fp32"]), len(TOKENS), tokens=TOKENS)
    mil = np.stack([o["logits"].reshape(-1) for o in run.outputs]).astype(np.float32)
    assert np.abs(got - mil).max() <= FP32_TOLERANCE * np.abs(mil).max()
    for name, state in run.states.items():  # both write the same fp16 cache
        assert np.abs(core_ai.states[name].astype(np.float32) - state.astype(np.float32)).max() <= 1e-2


@pytest.mark.parametrize("variant", ["repeat_kv", "qfold"])
def test_mil_interpreter_and_core_ai_runtime_agree_in_fp16_on_qfold_builds(tiny_builds, coreai_builds, variant):
    """qfold's own builds of one model and seed on both backends (fp16 weights): the Core ML package in the MIL
    interpreter vs the Core AI asset on the runtime, within 3e-2 × max |logit|: the Linux runtime accumulates fp16
    matmuls in fp16 (module runtime, FP16_TOLERANCE), so fp16 cannot be held to fp32's 1e-4."""
    run = decode_steps(load_interpreter(tiny_builds[variant]), len(TOKENS), tokens=TOKENS)
    mil = np.stack([o["logits"].reshape(-1) for o in run.outputs]).astype(np.float32)
    got, core_ai = _runtime_logits(coreai_builds[variant] / "model.aimodel")
    scale = np.abs(mil).max()
    assert np.abs(got - mil).max() <= FP16_TOLERANCE * scale
    assert (got.argmax(-1) == mil.argmax(-1)).mean() >= 0.75
    for name, state in run.states.items():  # the same fp16 cache written by both
        assert np.abs(core_ai.states[name].astype(np.float32) - state.astype(np.float32)).max() <= \
            FP16_TOLERANCE * max(np.abs(state.astype(np.float32)).max(), 1.0)


# ------------------------------------------------------------------------------------------------ bench
def test_bench_logs_two_builds_that_fit_reads(assets, tmp_path, capsys):
    a, _ = assets
    log, prof = tmp_path / "log.csv", tmp_path / "p.json"
    assert main(["bench", str(a["repeat_kv_float32"]), str(a["qfold_float32"]), "--steps", "2", "--rounds", "2",
                 "--warmup", "0", "--label", "rk", "--label", "qf", "--out", str(log), "--profile-out", str(prof),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [t["label"] for t in doc["targets"]] == ["rk", "qf"] and doc["notes"] == []
    for t in doc["targets"]:
        assert len(t["round_s"]) == 2 and t["tok_per_s_min"] <= t["tok_per_s_median"] <= t["tok_per_s_max"]
        assert t["join"].startswith("joined") and t["top_ops"] and t["context_length"] == TINY_CTX
    cats = {t["label"]: t["time_by_category_ms"] for t in json.loads(prof.read_text())["targets"]}
    assert cats["rk"]["replication"] > 0 and cats["qf"]["replication"] == 0
    # the profile is a placement plan of two targets: neither is named like the asset's function, so the join asks
    # for one (--function stays the analysis's function), and the qf target joins to the qfold asset
    assert main(["placement", str(prof), str(a["qfold_float32"]), "--json"]) == 1
    assert "pick one with --plan-function" in capsys.readouterr().err
    assert main(["placement", str(prof), str(a["qfold_float32"]), "--plan-function", "qf", "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    profiled = next(t["ops"] for t in json.loads(prof.read_text())["targets"] if t["label"] == "qf")
    assert j["matched"] == len(profiled) == j["by_device"]["CPU"]["ops"] and j["unmatched"]["plan_ops"] == []
    # one attribution: bench's time by category is the join's split of the same profiled times by the same bytes
    shares = {s["category"]: s["amount"] for s in j["share_by_category"]}
    assert {c: shares[c] for c in CATEGORIES} == pytest.approx({c: cats["qf"][c] for c in CATEGORIES}, abs=1e-3)
    assert shares["no_bytes"] == pytest.approx(cats["qf"]["compute"], abs=1e-3)
    ops = {op.name: op for op in read_asset(a["qfold_float32"]).ops}
    constants = [op for op in ops.values() if op.type == "coreai.constant"]
    missing = [ops[n] for n in j["unmatched"]["analysis_ops"]]
    assert constants and not any(op.kind == "const" or op.type == "coreai.create_token" for op in missing)
    assert len(missing) < len(profiled) / 4  # what the runtime timed under another op (fused), listed not dropped
    rows = list(csv.DictReader(log.open()))
    assert [r["build"] for r in rows] == ["rk", "qf"] and all(r["phase"] == "decode" for r in rows)
    assert main(["fit", str(log), "--build", f"rk={a['repeat_kv_float32']}", "--build", f"qf={a['qfold_float32']}",
                 "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    assert fit["files"][0]["n_accepted"] == 2 and fit["files"][0]["format"] == "qfold-csv"
    graph = {b["label"]: b["graph_bytes_per_token"] for b in fit["builds"]}
    assert 0 < graph["qf"] < graph["rk"]  # the log's labels reach the assets' byte accounts
    assert main(["bench", str(a["qfold_float16"]), "--steps", "1", "--rounds", "1", "--warmup", "0"]) == 0
    assert "fp16 matmul kernel" in capsys.readouterr().out  # Linux: fp16 timing is the matmul kernel's
    assert main(["bench", str(a["qfold_float32"]), "--label", "a", "--label", "b"]) == 1
    assert "one per target" in capsys.readouterr().err


def test_the_profile_join_claims_nothing_when_the_op_order_differs(assets):
    a, _ = assets
    program = read_asset(a["qfold_float32"])
    profile = Profile(1, 2_000_000, (OpTime("call.coreai.cast", 5, 1_000_000, 1),))
    ops, by_cat, join = join_profile(program, [("coreai.constant", None)], profile)
    assert ops == () and join.startswith("not joined") and by_cat["runtime"] == 1.0


def test_every_core_ai_child_is_held_to_its_limit_and_says_so(assets, tmp_path, monkeypatch):
    """The MLIR reader, the op-id reader, the fold's rewrite and the runtime itself, each given no time at all (a
    hung child, as far as the parent can tell): one line with the limit and how it was set, the child stopped; a
    failed op-id child leaves the bench's join unjoined, saying why, never a join of nothing."""
    a, _ = assets
    asset = a["qfold_float32"]
    program = read_asset(asset)
    monkeypatch.setattr(native_child, "FIXED_S", 0.0)
    monkeypatch.setattr(native_child, "FACTOR", 0.0)
    limit = "(its limit, 0 s + 0 x the estimated "
    with pytest.raises(AimodelError, match=r"reading its MLIR timed out after 0 s \(its limit, 0 s \+ 0 x "):
        read_asset(asset)
    with pytest.raises(CoreAIRuntimeError) as e:
        read_op_ids(asset)
    assert str(e.value).startswith(f"{asset}: reading its op ids timed out after 0 s {limit}")
    profile = Profile(1, 2_000_000, (OpTime("call.coreai.cast", 5, 1_000_000, 1),))
    ops, by_cat, join = join_asset(program, asset, profile)
    assert ops == () and by_cat["runtime"] == 1.0 and join == f"not joined: {e.value}"
    with pytest.raises(FoldError, match=r"the Core AI rewrite timed out after 0 s"):
        fold_asset(a["repeat_kv_float32"], tmp_path / "folded.aimodel", prove=False)
    with CoreAIRuntime() as runtime, pytest.raises(CoreAIRuntimeError) as e:
        runtime.load(asset)
    assert str(e.value) == (f"{asset}: the Core AI runtime did not answer within 0 s {limit}"
                            f"{native_child.asset_bytes(asset) * native_child.SECONDS_PER_GB / 1e9:.1f} s for "
                            f"{native_child.asset_bytes(asset) / 1e9:.2f} GB) while loading it; stopped")


def test_the_ratio_interval_is_the_median_s_order_statistics():
    """median_ci by hand: 5 paired ratios → [min, max] at 1 − 2/32; 10 → [x(2), x(9)] at 1 − 2·11/1024."""
    from analyzer.measure.bench import median_ci

    assert median_ci([1.3, 0.9, 1.1, 1.0, 1.2]) == (1.1, 0.9, 1.3, 1 - 2 / 32)
    med, low, high, level = median_ci([float(x) for x in range(10)])
    assert (med, low, high) == (4.5, 1.0, 8.0) and level == pytest.approx(1 - 2 * 11 / 1024)
    assert median_ci([2.0]) == (2.0, 2.0, 2.0, 0.0)  # one round: a ratio, no interval


def test_bench_times_prefill_beside_decode_with_ttft_memory_and_an_interval(coreai_builds, builds_root, capsys):
    """--phase decode,prefill --q-len 8: each decode build's prefill build beside it is timed too (prompt tok/s,
    TTFT = one call, measured), decode rows get a derived TTFT (8 steps), every row a peak memory, every row after
    the first of its phase a ratio with its interval; --compute-units other than cpu is refused on Linux."""
    from dataclasses import replace

    from analyzer.analysis.record import load_analysis
    from analyzer.convert.launch import run_builds

    decode = [coreai_builds["repeat_kv"], coreai_builds["qfold"]]
    args = ["bench", *map(str, decode), "--steps", "2", "--rounds", "3", "--warmup", "0", "--phase",
            "decode,prefill", "--q-len", "8", "--json"]
    assert main(args) == 1  # no prefill build yet: said, with what to build
    assert "no prefill build of its spec with --q-len 8" in capsys.readouterr().err
    run_builds([replace(load_analysis(d).build.spec, phase="prefill", q_len=8) for d in decode], builds_root)
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = doc["targets"]
    assert [(t["phase"], t["tokens_per_call"]) for t in rows] == [("decode", 1)] * 2 + [("prefill", 8)] * 2
    assert rows[0]["ratio_to_first"] is None and rows[2]["ratio_to_first"] is None
    for t in (rows[1], rows[3]):
        r = t["ratio_to_first"]
        assert r["rounds"] == 3 and r["low"] <= r["median"] <= r["high"] and r["level"] == 0.75
    # the first target loaded pays the runtime's start; a later tiny one may load into memory the allocator freed
    # (its RSS growth 0, measured as such: seen in a full run), so only the first's growth must be positive
    assert rows[0]["memory"]["resident_bytes"] > 0
    for t in rows:
        assert t["memory"]["peak_bytes"] >= t["memory"]["resident_bytes"] >= 0 and t["memory"]["peak_bytes"] > 0
        assert t["ttft_ms"] == pytest.approx(8 * t["ms_per_token_median"] if t["phase"] == "decode"
                                             else t["ms_per_call_median"])
        assert t["tok_per_s_median"] == pytest.approx(1e3 / t["ms_per_token_median"])
    assert "order statistics" in doc["ratio_method"]
    assert main(["bench", str(decode[0]), "--compute-units", "gpu"]) == 1
    assert "runs on the CPU only" in capsys.readouterr().err
