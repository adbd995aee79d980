"""decode + prefill in one .mlpackage: built, stored one analysis per function, inspected, diffed and listed
function by function, and its weight blobs shared (the package holds one copy of the weights)."""

import json
from pathlib import Path

import pytest

from analyzer.analysis.record import ANALYSIS_FILE, function_analysis_file, load_analyses, load_analysis
from analyzer.convert.launch import PACKAGE_NAME, reanalyze, run_build
from analyzer.errors import AnalysisFileError, QfoldError
from analyzer.ir.coreml.mil_reader import list_functions, read_program
from analyzer.model.sources import DEFAULT_PRESET, resolve_source
from analyzer.model.spec import BuildSpec
from analyzer.report.catalog import build_refs, phase_sibling

from .conftest import TINY_OVERRIDES, TINY_Q_LEN

WEIGHTS = Path("Data") / "com.apple.CoreML" / "weights" / "weight.bin"


@pytest.fixture
def cli(capsys):
    """``python -m analyzer ARGS`` in this process: (exit code, stdout, stderr)."""
    from analyzer.cli import main

    def run(*args):
        code = main([str(a) for a in args])
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def _blob_bytes(program) -> int:
    """Bytes of the weight constants a function reads from weight.bin (inline immediates are in the proto)."""
    return sum(op.const_bytes for op in program.ops if op.type == "const" and op.const_bytes >= 64)


def test_keys_of_decode_builds_are_unchanged_and_phases_are_keyed():
    src = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    decode = BuildSpec(src, "qfold", "state", 256)
    assert "phase" not in decode.fingerprint() and "phase" not in decode.to_json()
    assert decode.key.startswith("exaone-4.0-1.2b-qfold-state-ctx256-") and decode.key.count("-") == 6
    prefill = BuildSpec(src, "qfold", "state", 256, phase="prefill", q_len=64)
    both = BuildSpec(src, "qfold", "state", 256, phase="decode+prefill", q_len=64)
    assert prefill.key.startswith("exaone-4.0-1.2b-qfold-state-ctx256-prefill64-")
    assert both.key.startswith("exaone-4.0-1.2b-qfold-state-ctx256-decode+prefill64-")
    assert len({decode.key, prefill.key, both.key, BuildSpec(src, "qfold", "state", 256, phase="prefill",
                                                             q_len=128).key}) == 4
    assert BuildSpec.from_json(both.to_json()) == both
    assert both.for_phase("decode") == decode
    for bad, match in (({"q_len": 8}, "a decode build runs one token"), ({"phase": "prefill", "q_len": 512},
                       "2 to ctx=256"), ({"phase": "chunked"}, "choose one of decode, prefill, decode\\+prefill")):
        with pytest.raises(QfoldError, match=match):
            BuildSpec(src, "qfold", "state", 256, **bad)


def test_cli_refuses_a_q_len_for_decode_in_one_line(tmp_path, cli):
    code, _, err = cli("build", "--variant", "qfold", "--structure", "--q-len", "8", "--builds-dir", tmp_path)
    assert code != 0 and err.count("\n") == 1 and "--q-len 8" in err, err
    assert not any(tmp_path.iterdir())


@pytest.mark.conversion
def test_one_package_two_functions_one_copy_of_the_weights(tiny_phase_builds):
    folder = tiny_phase_builds["qfold"]
    pkg = folder / PACKAGE_NAME
    assert list_functions(pkg) == ("decode", "prefill")
    decode, prefill = read_program(pkg, "decode"), read_program(pkg, "prefill")
    shared = (pkg / WEIGHTS).stat().st_size
    one_copy = _blob_bytes(decode)
    # the same weights, read by both functions (prefill adds a few small constants: its row positions)
    assert abs(_blob_bytes(prefill) - one_copy) < 0.01 * one_copy
    assert 0.95 * one_copy <= shared <= 1.05 * one_copy, (shared, one_copy)  # stored once, not twice
    info = load_analysis(folder).build
    assert info.package_bytes < 1.1 * one_copy
    assert (folder / ANALYSIS_FILE).is_file() and (folder / function_analysis_file("prefill")).is_file()


@pytest.mark.conversion
def test_every_function_is_analysed_with_its_own_phase_and_check(tiny_phase_builds):
    decode, prefill = load_analyses(tiny_phase_builds["qfold"])
    assert (decode.function, decode.call.phase, decode.call.tokens_per_call) == ("decode", "decode", 1)
    assert (prefill.function, prefill.call.phase, prefill.call.tokens_per_call) == ("prefill", "prefill", TINY_Q_LEN)
    assert decode.build.equivalence.phase == "decode" and prefill.build.equivalence.phase == "prefill"
    assert prefill.build.equivalence.q_len == TINY_Q_LEN
    assert decode.build.key == prefill.build.key and decode.build.spec.phase == "decode+prefill"
    assert {t.name: t.shape for t in prefill.program.inputs}["input_ids"] == (1, TINY_Q_LEN)
    # per prompt token: the projections of a prefill call cost the same per token as a decode step's
    assert prefill.flops.per_token().projections == decode.flops.per_token().projections
    assert load_analysis(tiny_phase_builds["qfold"], "prefill").function == "prefill"
    with pytest.raises(AnalysisFileError, match="no function 'verify' \\(has decode, prefill\\)"):
        load_analysis(tiny_phase_builds["qfold"], "verify")


@pytest.mark.conversion
@pytest.mark.parametrize("target", ["build", "package"])
def test_inspect_reports_each_function(tiny_phase_builds, target, cli):
    path = tiny_phase_builds["repeat_kv"]
    path = path if target == "build" else path / PACKAGE_NAME
    code, out, err = cli("inspect", path, "--json")
    assert code == 0, err
    doc = json.loads(out)
    functions = {f["function"]: f for f in doc["functions"]}
    assert set(functions) == {"decode", "prefill"}
    assert functions["prefill"]["tokens_per_call"] == TINY_Q_LEN and functions["decode"]["tokens_per_call"] == 1
    for f in functions.values():
        assert f["flops_per_token"]["total"] == sum(v for k, v in f["flops_per_token"].items() if k != "total")
        assert f["tile_count"] == 4  # repeat_kv: K and V of 2 layers, in decode and in prefill
    text = cli("inspect", path)[1]
    assert "2 functions (decode, prefill)" in text and "== function prefill" in text
    assert "per prompt token (per call ÷ 64)" in text
    one = json.loads(cli("inspect", path, "--json", "--function", "prefill")[1])
    assert "functions" not in one and one["phase"] == "prefill"


@pytest.mark.conversion
def test_diff_compares_function_by_function(tiny_phase_builds, cli):
    code, out, err = cli("diff", tiny_phase_builds["repeat_kv"], tiny_phase_builds["qfold"], "--json")
    assert code == 0, err
    doc = json.loads(out)
    functions = {f["function"]: f for f in doc["functions"]}
    assert set(functions) == {"decode", "prefill"}
    assert functions["decode"]["tile_count"] == {"a": 4, "b": 0, "delta": -4}
    assert functions["prefill"]["tile_count"]["a"] == 4  # Q-fold prefill keeps one mask tile (kind "other")
    assert functions["prefill"]["flops_per_token"]["attention_scores"]["delta"] == 0  # same arithmetic
    assert functions["prefill"]["bytes_per_token"]["replication"]["b"] == 0


@pytest.mark.conversion
def test_catalog_lists_each_function_and_finds_its_sibling(tiny_phase_builds, builds_root):
    refs = [r for r in build_refs(builds_root) if r.path in set(tiny_phase_builds.values())]
    assert sorted((r.variant, r.function, r.phase) for r in refs) == [
        ("qfold", "decode", "decode"), ("qfold", "prefill", "prefill"),
        ("repeat_kv", "decode", "decode"), ("repeat_kv", "prefill", "prefill")]
    decode = next(r for r in refs if r.variant == "qfold" and r.phase == "decode")
    assert phase_sibling(decode, "prefill", refs).function == "prefill"
    assert phase_sibling(decode, "decode", refs) is decode


@pytest.mark.conversion
def test_reanalyze_rewrites_every_function(tiny_phase_builds, tmp_path):
    import shutil

    copy = tmp_path / tiny_phase_builds["qfold"].name
    shutil.copytree(tiny_phase_builds["qfold"], copy)
    before = [a.summary for a in load_analyses(copy)]
    reanalyze(copy)
    assert [a.summary for a in load_analyses(copy)] == before
    assert [a.function for a in load_analyses(copy)] == ["decode", "prefill"]


@pytest.mark.full
def test_full_size_multifunction_package_shares_its_weights(tmp_path):
    """The default preset at full size (≈ 2.5 GB of fp16 weights) as decode+prefill: the package holds one copy."""
    spec = BuildSpec(resolve_source(DEFAULT_PRESET), "qfold", "state", 4096, phase="decode+prefill", q_len=64)
    folder = run_build(spec, tmp_path).path
    pkg = folder / PACKAGE_NAME
    one_copy = _blob_bytes(read_program(pkg, "decode"))
    assert 0.99 * one_copy <= (pkg / WEIGHTS).stat().st_size <= 1.01 * one_copy
    assert [a.function for a in load_analyses(folder)] == ["decode", "prefill"]


@pytest.mark.conversion
def test_graph_and_fit_never_pick_one_function_silently(tiny_phase_builds, cli, tmp_path):
    folder = tiny_phase_builds["qfold"]
    code, _, err = cli("graph", folder, "--layer", "0", "--out", tmp_path / "g.dot")
    assert code == 1 and "2 functions (decode, prefill); pick one with --function" in err
    code, _, err = cli("graph", tiny_phase_builds["repeat_kv"], folder, "--function", "prefill", "--layer", "0",
                         "--out", tmp_path / "g.dot")
    assert code == 0, err
    assert "[1,1,256,256]" in (tmp_path / "g.dot").read_text()  # the prefill's merged-row scores of Q-fold
    log = tmp_path / "log.csv"
    log.write_text("device,build,tok_per_s\nphone,pre,10\n")
    prefill_only = tmp_path / "prefill.analysis.json"
    prefill_only.write_text((folder / function_analysis_file("prefill")).read_text())
    code, _, err = cli("fit", log, "--build", f"pre={prefill_only}")
    assert code != 0 and "a prefill analysis (64 tokens per call)" in err
    code, _, err = cli("fit", log, "--build", f"pre={folder}")  # the build's default function: decode
    assert code == 0, err
