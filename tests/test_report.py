"""The one-file HTML report and the A/B headline: headline figures present, charts embedded, nothing fetched."""

from __future__ import annotations

import re
import zipfile
from datetime import UTC, datetime

import pytest

from analyzer.device.bandwidth import WRITEUP_AB_IPHONE, crosscheck, fixed_assumption
from analyzer.device.logs import BuildDeviceSummary
from analyzer.fmt import MB, MIB
from analyzer.report import figures, report
from analyzer.report.catalog import load_shipped, shipped_analyses
from tests.test_figures import TILE_BYTES, make_doc

REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=\s*[\"']?\s*(?:https?:)?//", re.IGNORECASE)
REMOTE_LINK = re.compile(r"<link[^>]*\bhref\s*=\s*[\"']?\s*(?:https?:)?//", re.IGNORECASE)


def with_spec(doc: dict, variant: str, fp16_identical: bool = True) -> dict:
    """Give a hand-made analysis a build spec and the equivalence every build records."""
    doc["spec"] = {"source": {"label": "m", "fingerprint": {"config": {"x": 1}}}, "variant": variant,
                   "kv_mode": "state", "ctx": 4096, "compression": None}
    doc["equivalence"] = {"steps": 8, "pairs": [
        {"variant_a": "repeat_kv", "variant_b": "qfold", "dtype": "fp32", "steps": 8, "max_abs_diff": 9.3e-6,
         "bit_identical": False, "greedy_agree_steps": 8},
        {"variant_a": "repeat_kv", "variant_b": "qfold", "dtype": "fp16", "steps": 8,
         "max_abs_diff": 0.0 if fp16_identical else 1e-3, "bit_identical": fp16_identical, "greedy_agree_steps": 8},
    ]}
    doc["versions"] = {"qfold": "0.1.0", "coremltools": "9.0"}
    return doc


@pytest.fixture
def ab() -> tuple[dict, dict]:
    return with_spec(make_doc(tiles=60, layers=30), "repeat_kv"), with_spec(make_doc(tiles=0, layers=30), "qfold")


@pytest.fixture
def section() -> report.BandwidthSection:
    a, b = (make_doc(tiles=60, layers=30), make_doc(tiles=0, layers=30))
    summaries = [BuildDeviceSummary("exaone-repeat_kv-top8", "dev", 1, 20.39, 0.0, 20.39, 20.39),
                 BuildDeviceSummary("exaone-qfold-top8", "dev", 1, 54.30, 0.0, 54.30, 54.30)]
    graph = {"exaone-repeat_kv-top8": a["bytes"]["bytes_per_token"]["total"],
             "exaone-qfold-top8": b["bytes"]["bytes_per_token"]["total"]}
    cc = crosscheck(summaries, graph, fixed_assumption(WRITEUP_AB_IPHONE.bytes_per_s))
    return report.BandwidthSection(figures.bandwidth_frame(cc), figures.pairs_frame(cc),
                                   (figures.BandwidthCurve("BW", WRITEUP_AB_IPHONE.bytes_per_s),),
                                   ("one bandwidth does not explain <these> builds",))


def test_headline_numbers(ab):
    a, b = ab
    h = report.ab_headline(a, b, bw_bytes_per_s=55_900 * MB)
    assert (h.tiles_a, h.tiles_b) == (60, 0)
    assert h.tile_bytes_a == 60 * TILE_BYTES == 960 * MIB
    ta, tb = a["bytes"]["bytes_per_token"]["total"], b["bytes"]["bytes_per_token"]["total"]
    assert h.tok_per_s_a == pytest.approx(55_900 * MB / ta)
    assert h.speedup == pytest.approx(ta / tb)  # BW cancels
    eq = h.equivalence
    assert eq is not None and eq.fp16_bit_identical and eq.fp32_max_abs_diff == pytest.approx(9.3e-6)
    assert eq.greedy_agree_steps == 8 == eq.steps
    frame = report.headline_frame(h)
    assert frame.set_index("what").loc["tile ops"].to_dict() == {"a": 60, "b": 0, "unit": "ops"}


def test_equivalence_only_between_variants_of_one_source(ab):
    a, b = ab
    assert report.equivalence_summary(a, a) is None  # same variant
    other = dict(b, spec={**b["spec"], "ctx": 256})
    assert report.equivalence_summary(a, other) is None  # different ctx: a different build pair
    assert report.equivalence_summary(make_doc(tiles=4), make_doc(tiles=0)) is None  # packages: no spec


def test_report_has_headline_charts_and_is_self_contained(ab, section):
    a, b = ab
    when = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    html = report.build_report(a, b, label_a="repeat_kv <A>", label_b="qfold & B", bandwidth=section,
                               generated_at=when)
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    for text in ("60 → 0", "960 → 0 MiB", "predicted speedup B/A", "fp16 bit-identical", "greedy agreement 8/8",
                 "No Core ML runtime on Linux", "2026-11-30 12:00 UTC", "Bandwidth model"):
        assert text in html, text
    assert "repeat_kv &lt;A&gt;" in html and "qfold &amp; B" in html and "<A>" not in html
    assert "&lt;these&gt;" in html  # verdicts are escaped too
    assert not REMOTE_SCRIPT.search(html) and not REMOTE_LINK.search(html)
    # plotly.js is embedded once, then every chart reuses it
    assert len(re.findall(r"plotly\.js v\d", html)) == 1 and len(html) > 1_000_000
    assert html.count("window.PlotlyConfig") == 1
    assert html.count('class="plotly-graph-div"') == 6  # waterfall, ops, layers, bandwidth, inferred, residuals


def test_report_without_bandwidth_section(ab):
    html = report.build_report(*ab)
    assert 'class="plotly-graph-div"' in html and "Bandwidth model" not in html


@pytest.mark.skipif(not {"repeat_kv", "qfold"} <= set(shipped_analyses()),
                    reason="the shipped full-size analyses are not both installed in analyzer/shipped/")
def test_report_of_the_shipped_default_reproduces_the_writeup():
    a, b = load_shipped("repeat_kv"), load_shipped("qfold")
    html = report.build_report(a, b, label_a="repeat_kv", label_b="qfold")
    assert "60 → 0" in html and "960 → 0 MiB" in html
    h = report.ab_headline(a, b, bw_bytes_per_s=WRITEUP_AB_IPHONE.bytes_per_s)
    assert h.bytes_per_token_a["replication"] - h.bytes_per_token_b["replication"] == 1_920 * MIB


def test_zip_package_small(tmp_path):
    pkg = tmp_path / "model.mlpackage"
    (pkg / "Data" / "com.apple.CoreML").mkdir(parents=True)
    (pkg / "Manifest.json").write_text("{}")
    (pkg / "Data" / "com.apple.CoreML" / "model.mlmodel").write_bytes(b"\x00" * 1000)
    assert report.package_size_bytes(pkg) == 1002
    with report.zip_package(pkg) as f, zipfile.ZipFile(f) as zf:
        assert sorted(zf.namelist()) == ["model.mlpackage/Data/com.apple.CoreML/model.mlmodel",
                                         "model.mlpackage/Manifest.json"]
