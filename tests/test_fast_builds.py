"""Build modes through the CLI and the dashboard: an A/B in analysis mode from one command (one child, no
package), the same command in materialised mode reusing the session's builds, exporting a package from an
analysis-mode build, and the cost the pages state."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.analysis.record import read_analysis_file
from analyzer.convert.launch import LOG_FILE, PACKAGE_NAME, run_builds
from analyzer.errors import SourceError
from analyzer.model.cost import MEMORY_LIMIT_ENV, check_request, estimate
from analyzer.model.sources import DEFAULT_PRESET, load_config, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, MATERIALISED_MODE, BuildSpec

REPO = Path(__file__).resolve().parent.parent
TINY_ARGS = ("--structure", "--set", "num_hidden_layers=2", "--ctx", "256")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "analyzer", *args], capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ), timeout=1200)


@pytest.fixture(scope="module")
def cli_analysis_ab(builds_root) -> list[Path]:
    out = _cli("build", "--variant", "repeat_kv", "qfold", *TINY_ARGS, "--builds-dir", str(builds_root))
    assert out.returncode == 0, out.stderr
    return [Path(line) for line in out.stdout.strip().splitlines()]


@pytest.mark.conversion
def test_cli_ab_in_analysis_mode_is_one_child_with_no_package(cli_analysis_ab):
    a, b = cli_analysis_ab
    docs = [read_analysis_file(p) for p in (a, b)]
    assert [d.variant for d in docs] == ["repeat_kv", "qfold"]
    assert all(d.build.build_mode == ANALYSIS_MODE and d.build.extra["built_together"] == [a.name, b.name]
               for d in docs)
    # a model of the reduced model's size converts faster than a worker process starts: its second variant and its
    # equivalence check run in the child itself (a larger A/B's worker: test_structure_ab_in_one_process_...)
    assert not any("converted_in_worker" in d.build.extra for d in docs)
    where = "in this process (a model of the reduced model's size: quicker than starting a worker)"
    log = (a / LOG_FILE).read_text()  # the session's builds folder may hold this geometry's check already
    assert f"checking the variants' equivalence {where}" in log or "reusing the equivalence check" in log, log
    assert not (a / PACKAGE_NAME).exists() and not (b / PACKAGE_NAME).exists()
    assert docs[0].summary.tile_count == 4 and docs[1].summary.tile_count == 0
    shown = _cli("inspect", str(a), "--json")
    inspect = json.loads(shown.stdout)  # the analysis alone is enough
    assert inspect["bytes_per_token"] == docs[0].bytes_per_token.to_json()
    assert inspect["build_mode"] == ANALYSIS_MODE and inspect["spec"]["build_mode"] == ANALYSIS_MODE
    assert "build mode: analysis (value-free weights, no package)" in _cli("inspect", str(a)).stdout
    for cmd in (("run", str(a), "--steps", "2", "--out", str(a.parent / "out.npz")), ("fold", str(a), "x.mlpackage")):
        refused = _cli(*cmd)  # nothing to run or fold: said, not a traceback
        assert refused.returncode == 1 and "an analysis-mode build keeps none" in refused.stderr, refused.stderr
        assert "--mode materialised" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
    again = _cli("reanalyze", str(a))  # no package: the stored ops' facts are derived again, the mode kept
    assert again.returncode == 0, again.stderr
    assert read_analysis_file(a).build.build_mode == ANALYSIS_MODE


@pytest.mark.conversion
def test_cli_materialised_mode_is_a_different_build_with_the_same_analysis(cli_analysis_ab, tiny_builds,
                                                                           builds_root):
    out = _cli("build", "--mode", "materialised", "--variant", "repeat_kv", "qfold", *TINY_ARGS,
               "--builds-dir", str(builds_root))
    assert out.returncode == 0, out.stderr
    paths = [Path(line) for line in out.stdout.strip().splitlines()]
    assert paths == [tiny_builds["repeat_kv"], tiny_builds["qfold"]]  # conftest's builds: reused
    assert "reused" in out.stderr
    for analysis, materialised in zip(cli_analysis_ab, paths, strict=True):
        a, m = read_analysis_file(analysis), read_analysis_file(materialised)
        assert analysis.name != materialised.name and m.build.build_mode == MATERIALISED_MODE
        assert a.summary == m.summary and a.bytes_per_token == m.bytes_per_token


def test_cli_refuses_a_fold_build_in_analysis_mode(builds_root):
    out = _cli("build", "--variant", "repeat_kv+fold", "--mode", "analysis", *TINY_ARGS,
               "--builds-dir", str(builds_root))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1
    assert "needs weight values" in out.stderr and "--mode materialised" in out.stderr


def test_cli_build_never_loads_coremltools_and_refuses_a_prefill_fold_before_converting(tmp_path):
    """The fold pass (coremltools, and torch with it) loads in the fold route's own child: `build`'s errors and
    --help answer without it, and a fold it cannot make is refused before anything converts."""
    probe = "import sys, analyzer.cli.build; print(sorted({'coremltools', 'torch'} & set(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stderr
    out = _cli("build", "--variant", "repeat_kv+fold", "--phase", "prefill", *TINY_ARGS,
               "--builds-dir", str(tmp_path))
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "folds the decode step only" in out.stderr and "Traceback" not in out.stderr
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == []  # nothing was converted


@pytest.mark.conversion
def test_cli_fold_route_converts_with_the_other_variants_and_folds_in_a_child(tiny_builds, tmp_path):
    """`build --variant qfold repeat_kv+fold` (materialised): one request for both conversions (here the
    session's tiny pair, copied in: reused), then the fold, proven in the interpreter, in a child of its own."""
    for build in tiny_builds.values():
        shutil.copytree(build, tmp_path / build.name)
    out = _cli("build", "--variant", "qfold", "repeat_kv+fold", *TINY_ARGS, "--mode", "materialised",
               "--builds-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    qfold, folded = (Path(line) for line in out.stdout.strip().splitlines())
    assert qfold == tmp_path / tiny_builds["qfold"].name
    assert folded.parent == tmp_path and "-repeat_kv+fold-state-ctx256-" in folded.name
    doc = read_analysis_file(folded)
    assert doc.build.spec.variant == "repeat_kv+fold" and doc.summary.tile_count == 0
    assert doc.build.extra["folded_from"] == tiny_builds["repeat_kv"].name
    assert doc.build.check("folded_vs_original").checked
    assert (folded / PACKAGE_NAME).is_dir() and f"built {folded.name}" in out.stderr
    assert "] fold: folding " in out.stderr  # the child's progress reached the CLI
    assert len(list((tmp_path / ".logs").glob(f"{tiny_builds['repeat_kv'].name}-fold.*.log"))) == 1


@pytest.mark.conversion
def test_exporting_an_analysis_makes_the_materialised_build_of_the_same_spec(cli_analysis_ab, tiny_builds):
    analysis = read_analysis_file(cli_analysis_ab[1])
    spec = analysis.build.spec.materialised()
    assert spec.build_mode == MATERIALISED_MODE and spec.key == tiny_builds["qfold"].name
    cost = estimate(load_config(spec.source), spec.ctx, spec.build_mode)
    assert cost.mode == MATERIALISED_MODE and cost.package_bytes == cost.weight_bytes_fp16 > 0


@pytest.mark.conversion
def test_export_page_offers_a_materialised_build_for_an_analysis(cli_analysis_ab):
    from .test_app import open_page

    at = open_page("app_pages/export.py", export_ref=f"build:{cli_analysis_ab[1].name}")
    assert any("analysis mode" in str(i.value) for i in at.info)
    assert "export_materialise" in [b.key for b in at.button]
    assert any("materialised build" in str(m.value) for m in at.markdown)


def test_one_cost_model_follows_the_mode():
    """analyzer/model/cost.py: an analysis build's memory barely grows with the parameters and keeps no
    package; a materialised one holds the weights (and a package of their size). The measured figures are
    tests/test_cost_model.py's."""
    config = load_config(resolve_source(DEFAULT_PRESET))
    analysis, materialised = estimate(config, 4096, ANALYSIS_MODE), estimate(config, 4096, MATERIALISED_MODE)
    assert analysis.package_bytes is None and materialised.package_bytes == materialised.weight_bytes_fp16
    assert analysis.peak_rss_bytes < 2.5e9 < materialised.peak_rss_bytes < 8e9  # bench: ~1.3 GB vs ~4.6 GB
    assert "2 analysis builds" in estimate(config, 4096, ANALYSIS_MODE, builds=2).summary()
    assert "package" in materialised.summary()
    big = load_config(resolve_source("llama-3.1-8b"))
    assert estimate(big, 4096, ANALYSIS_MODE).peak_rss_bytes < 6e9  # the bound for 7-8B at ctx 4096
    assert estimate(big, 4096, MATERIALISED_MODE).peak_rss_bytes > 16e9  # 16 GB of fp16 weights, held more than once


def test_cost_guards_admit_a_70b_analysis_on_a_16_gb_laptop(monkeypatch):
    """Issue 23: the llama-3.1-70b preset passes the ceilings and the memory estimate in analysis mode on a 16 GB
    machine; a materialised build of it (~0.8 TB estimated) is refused before anything is allocated."""
    monkeypatch.setenv(MEMORY_LIMIT_ENV, str(16 * 10**9))
    huge = load_config(resolve_source("llama-3.1-70b"))
    cost = check_request(huge, 4096, mode=ANALYSIS_MODE)
    assert cost.params > 70e9 and cost.peak_rss_bytes < 16e9
    with pytest.raises(SourceError, match="does not fit"):
        check_request(huge, 4096, mode=MATERIALISED_MODE)


def test_a_corrupt_weights_file_is_refused_before_a_child_starts(tmp_path):
    """run_builds reads the safetensors headers of a folder source first: a corrupt file is one line naming it,
    with no conversion child started (no request or log written) and nothing in the builds folder."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(resolve_source(DEFAULT_PRESET).config_dict))
    (folder / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    builds = tmp_path / "builds"
    with pytest.raises(SourceError, match=r"model\.safetensors: not a readable safetensors file"):
        run_builds([BuildSpec(resolve_source(str(folder)), "qfold", "state", 64, build_mode=ANALYSIS_MODE)], builds)
    assert not builds.exists() or not any(builds.rglob("*"))
