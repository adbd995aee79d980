"""Done-when of issue #9 on real conversions: for every GQA/MQA preset (2 layers, small MLP and vocab, the
preset's own heads, KV heads and head dim: the session's ``preset_packages``), the ``repeat_kv+fold``
route (repeat_kv build + the pass) has zero ``kv_replication`` tiles, the same bytes per token as the qfold build of
the same spec, identical stored weights, and the MIL interpreter gives the same outputs and final states as the
original over 4 decode steps.

Tolerance: max |Δ| ≤ 1e-2 × max |output| (the issue's bound). In practice the fold is bit-identical in the
interpreter: every output row is computed by the same dot products in the same order, only regrouped.
"""

from __future__ import annotations

import json

import pytest

from analyzer.analysis.accounting import account
from analyzer.analysis.record import load_analysis
from analyzer.fold.cache import FOLD_FILE, build_folded, fold_cached
from analyzer.fold.coreml.package import fold_package
from analyzer.fold.proof import prove_fold
from analyzer.ir.coreml.mil_reader import read_program
from analyzer.model.sources import DEFAULT_PRESET, geometry_of, load_config, resolve_source
from analyzer.model.spec import FOLD_VARIANT, BuildSpec
from tests.conftest import TINY_CTX, TINY_OVERRIDES, preset_source

PRESETS = ["exaone-4.0-1.2b", "llama-3.2-1b", "qwen2.5-0.5b", "qwen3-0.6b", "mistral-7b-v0.3", "gemma-3-1b"]
CASES = [(p, "state") for p in PRESETS] + [("exaone-4.0-1.2b", "input")]


@pytest.fixture(scope="module")
def conversions(preset_packages, tmp_path_factory):
    """Per (preset, kv mode): the session's repeat_kv and qfold packages (conftest ``preset_packages``), and the
    fold of repeat_kv with its report and interpreter proof (4 decode steps)."""
    out = {}
    for preset, kv in CASES:
        paths = {v: preset_packages(preset, v, kv) for v in ("repeat_kv", "qfold")}
        paths["folded"] = tmp_path_factory.mktemp(f"{preset}-{kv}") / "folded.mlpackage"
        report = fold_package(paths["repeat_kv"], paths["folded"])
        proof = prove_fold(paths["repeat_kv"], paths["folded"], steps=4)
        out[(preset, kv)] = (paths, report, proof, geometry_of(load_config(preset_source(preset))))
    return out


@pytest.mark.conversion
@pytest.mark.parametrize("preset, kv", CASES)
def test_fold_of_repeat_kv_is_the_qfold_build(conversions, preset, kv):
    paths, _, _, geometry = conversions[(preset, kv)]
    original, folded, qfold = (read_program(paths[v]) for v in ("repeat_kv", "folded", "qfold"))
    assert geometry.group_size > 1
    replicas = 2 * geometry.num_layers * (2 if kv == "input" else 1)  # K and V (and the new token's, input mode)
    assert sum(op.tile_kind == "kv_replication" for op in original.ops) == replicas
    assert sum(op.tile_kind == "kv_replication" for op in folded.ops) == 0
    assert folded.tiles() == []
    before, after, target = (account(p).totals() for p in (original, folded, qfold))
    for category in ("weights", "kv_read", "kv_write", "kv_write_value_semantics"):
        assert after[category] == target[category] == before[category], category
    assert after["replication"] == 0 < before["replication"]
    assert after == target  # activations too: the folded graph moves exactly what the qfold build moves
    assert [(t.name, t.shape, t.dtype) for t in (*folded.inputs, *folded.states, *folded.outputs)] == \
           [(t.name, t.shape, t.dtype) for t in (*original.inputs, *original.states, *original.outputs)]
    assert max(len(t.shape) for op in folded.ops for t in op.outputs) <= 4


@pytest.mark.conversion
@pytest.mark.parametrize("preset, kv", CASES)
def test_fold_is_proven_in_the_interpreter(conversions, preset, kv):
    _, report, proof, _ = conversions[(preset, kv)]
    assert report.weights is not None and report.weights.ok
    assert report.weights.identical == report.weights.checked > 0 and not report.weights.removed
    assert report.tiles_folded == report.tiles_found > 0 and not report.tiles_left
    assert {d.mapping for d in report.decisions} == {"h // G"}
    assert proof.checked and proof.steps == 4, proof
    names = {"logits", *(f"{kv_}_cache_{i}" for i in range(2) for kv_ in "kv")} if kv == "state" else \
        {"logits", "new_k", "new_v"}
    assert set(proof.max_abs_diff) == names
    for name, diff in proof.max_abs_diff.items():
        assert diff <= 1e-2 * proof.max_abs_value[name], (name, diff, proof.max_abs_value[name])
    assert proof.within_tolerance


# ------------------------------------------------------------------------------------------------ the build route
@pytest.fixture(scope="module")
def folded_build(tiny_builds, builds_root):
    """``--variant repeat_kv+fold`` of the session's tiny spec: reuses its repeat_kv build, adds the fold."""
    spec = BuildSpec(resolve_source(DEFAULT_PRESET, TINY_OVERRIDES), "repeat_kv", "state", TINY_CTX)
    result = build_folded(spec, builds_root)
    assert f"-{FOLD_VARIANT}-state-" in result.path.name
    return result.path


@pytest.mark.conversion
def test_repeat_kv_fold_build_sits_beside_its_original(folded_build, tiny_builds):
    folded = load_analysis(folded_build)
    assert folded.build.spec.variant == FOLD_VARIANT
    assert folded.build.extra["folded_from"] == tiny_builds["repeat_kv"].name
    assert folded.summary.tile_count == 0
    assert folded.bytes_per_token == load_analysis(tiny_builds["qfold"]).bytes_per_token
    checks = {c.kind: c for c in folded.build.checks}
    assert {"torch_variants", "interpreter_vs_torch", "folded_vs_original"} <= set(checks)
    assert checks["folded_vs_original"].checked and checks["folded_vs_original"].bit_identical
    assert checks["interpreter_vs_torch"].checked  # the original build's package against torch
    # the A/B of the original and its fold shows the interpreter's proof, not the torch pair
    from analyzer.report.headline import equivalence_summary, equivalence_text

    eq = equivalence_summary(load_analysis(tiny_builds["repeat_kv"]), folded)
    assert eq is not None and eq.checked.startswith("MIL interpreter") and eq.fp16_bit_identical
    assert "folded vs original" in equivalence_text(eq)


@pytest.mark.conversion
def test_folding_twice_reuses_the_first_fold(folded_build, tiny_builds, builds_root):
    first = fold_cached(tiny_builds["repeat_kv"], builds_root)  # build_folded already folded it once
    assert first.reused and (first.path / FOLD_FILE).is_file()
    assert json.loads((first.path / FOLD_FILE).read_text())["report"]["tiles_folded"] == 4
    assert first.key == fold_cached(tiny_builds["repeat_kv"] / "model.mlpackage", builds_root).key


@pytest.mark.conversion
def test_cli_fold_contract(tiny_builds, builds_root, tmp_path, capsys):
    """``fold IN OUT --json`` reports tiles and bytes; a package with nothing to fold exits 0 and says so; an
    unreadable one exits non-zero with one line on stderr."""
    from analyzer.cli import main

    def fold(*args) -> tuple[int, str, str]:
        code = main(["fold", *map(str, args), "--builds-dir", str(builds_root)])
        out = capsys.readouterr()
        return code, out.out, out.err

    code, out, err = fold(tiny_builds["repeat_kv"], tmp_path / "f.mlpackage", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["tiles_found"], doc["tiles_folded"], doc["tiles_left"]) == (4, 4, 0)
    main_fn = doc["functions"][0]
    assert main_fn["after"]["replication"] == 0 < main_fn["before"]["replication"]
    assert main_fn["before"]["weights"] == main_fn["after"]["weights"]
    assert doc["proof"]["checked"] and doc["proof"]["bit_identical"]
    assert read_program(tmp_path / "f.mlpackage").tiles() == []
    code, out, _ = fold(tiny_builds["qfold"], tmp_path / "g.mlpackage")
    assert code == 0 and "nothing to fold" in out and (tmp_path / "g.mlpackage").is_dir()
    bad = tmp_path / "bad.mlpackage"
    bad.mkdir()
    code, out, err = fold(bad, tmp_path / "h.mlpackage")
    assert code != 0 and err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.conversion
def test_multifunction_package_folds_each_function(tiny_builds, tmp_path):
    """Two functions (a repeat_kv and a qfold decode step): the one with tiles is folded, both are proven."""
    from coremltools.models.utils import MultiFunctionDescriptor, save_multifunction

    desc = MultiFunctionDescriptor()
    desc.add_function(str(tiny_builds["repeat_kv"] / "model.mlpackage"), "main", "copies")
    desc.add_function(str(tiny_builds["qfold"] / "model.mlpackage"), "main", "folded_already")
    desc.default_function_name = "copies"
    save_multifunction(desc, str(tmp_path / "multi.mlpackage"))
    report = fold_package(tmp_path / "multi.mlpackage", tmp_path / "out.mlpackage")
    tiles = {f.function: (f.kv_replication_tiles_before, f.kv_replication_tiles_after) for f in report.functions}
    assert tiles == {"copies": (4, 0), "folded_already": (0, 0)}
    assert report.weights is not None and report.weights.ok
    proof = prove_fold(tmp_path / "multi.mlpackage", tmp_path / "out.mlpackage", steps=2)
    assert proof.checked and proof.bit_identical
    assert {n.split("/")[0] for n in proof.max_abs_diff} == {"copies", "folded_already"}
    assert read_program(tmp_path / "out.mlpackage", "copies").tiles() == []
