"""Build modes through the CLI and the dashboard: an A/B in analysis mode from one command (one child, no
package), the same command in materialised mode reusing the session's builds, exporting a package from an
analysis-mode build, and the cost the pages state."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.build.builds import ANALYSIS_MODE, MATERIALISED_MODE, PACKAGE_NAME, materialised_spec
from analyzer.build.costs import GB, analysis_weight_bytes, estimate_cost
from analyzer.errors import QfoldError
from analyzer.graph.record import load_analysis

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
    docs = [load_analysis(p) for p in (a, b)]
    assert [d["spec"]["variant"] for d in docs] == ["repeat_kv", "qfold"]
    assert all(d["build_mode"] == ANALYSIS_MODE and d["built_together"] == [a.name, b.name] for d in docs)
    assert not (a / PACKAGE_NAME).exists() and not (b / PACKAGE_NAME).exists()
    assert docs[0]["summary"]["tile_count"] == 4 and docs[1]["summary"]["tile_count"] == 0
    inspect = json.loads(_cli("inspect", str(a), "--json").stdout)  # the analysis alone is enough
    assert inspect["bytes_per_token"] == docs[0]["bytes"]["bytes_per_token"]
    again = _cli("reanalyze", str(a))
    assert again.returncode == 1 and "keeps no .mlpackage" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1


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
        a, m = load_analysis(analysis), load_analysis(materialised)
        assert analysis.name != materialised.name and m["build_mode"] == MATERIALISED_MODE
        assert a["summary"] == m["summary"] and a["bytes"] == m["bytes"]


@pytest.mark.conversion
def test_exporting_an_analysis_makes_the_materialised_build_of_the_same_spec(cli_analysis_ab, tiny_builds):
    doc = load_analysis(cli_analysis_ab[1])
    spec = materialised_spec(doc["spec"])
    assert spec.build_mode == MATERIALISED_MODE and spec.key == tiny_builds["qfold"].name
    cost = estimate_cost(MATERIALISED_MODE, analysis_weight_bytes(doc))
    assert cost.package_bytes == analysis_weight_bytes(doc) > 0


@pytest.mark.conversion
def test_export_page_offers_a_materialised_build_for_an_analysis(cli_analysis_ab):
    from .test_app import open_page

    at = open_page("app_pages/export.py", export_ref=f"build:{cli_analysis_ab[1].name}")
    assert any("analysis mode" in str(i.value) for i in at.info)
    assert "export_materialise" in [b.key for b in at.button]
    assert any("materialised build" in str(m.value) for m in at.markdown)


def test_costs_follow_the_mode():
    w = int(2.56 * GB)  # the default preset's fp16 weights
    analysis, materialised = estimate_cost(ANALYSIS_MODE, w, 2), estimate_cost(MATERIALISED_MODE, w)
    assert analysis.package_bytes is None and materialised.package_bytes == w
    assert analysis.peak_rss_bytes < materialised.peak_rss_bytes
    assert "2 builds" in analysis.summary() and "package" in materialised.summary()
    with pytest.raises(QfoldError, match="build mode 'quick'"):
        estimate_cost("quick", w)
