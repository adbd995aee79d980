"""The one-file HTML report and the A/B headline: headline figures present, charts embedded, nothing fetched."""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from analyzer.fmt import MB, MIB
from analyzer.measure.logs import BuildDeviceSummary
from analyzer.predict.bandwidth_model import WRITEUP_AB_IPHONE, fixed_assumption
from analyzer.predict.crosscheck import crosscheck
from analyzer.report import bandwidth_figures, headline, report
from analyzer.report.catalog import load_shipped
from tests.synthetic import TILE_BYTES, build_info, decode_analysis, decode_program, equivalence

REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=\s*[\"']?\s*(?:https?:)?//", re.IGNORECASE)
REMOTE_LINK = re.compile(r"<link[^>]*\bhref\s*=\s*[\"']?\s*(?:https?:)?//", re.IGNORECASE)


@pytest.fixture(scope="module")
def ab():
    return decode_analysis("repeat_kv", 30), decode_analysis("qfold", 30)


@pytest.fixture(scope="module")
def section(ab) -> report.BandwidthSection:
    a, b = ab
    summaries = [BuildDeviceSummary("exaone-repeat_kv-top8", "dev", 1, 20.39, 0.0, 20.39, 20.39),
                 BuildDeviceSummary("exaone-qfold-top8", "dev", 1, 54.30, 0.0, 54.30, 54.30)]
    graph = {"exaone-repeat_kv-top8": a.bytes_per_token.total, "exaone-qfold-top8": b.bytes_per_token.total}
    cc = crosscheck(summaries, graph, fixed_assumption(WRITEUP_AB_IPHONE.bytes_per_s))
    return report.BandwidthSection(bandwidth_figures.bandwidth_frame(cc), bandwidth_figures.pairs_frame(cc),
                                   (bandwidth_figures.BandwidthCurve("BW", WRITEUP_AB_IPHONE.bytes_per_s),),
                                   ("one bandwidth does not explain <these> builds",),
                                   ("exaone-qfold-top8: weights <assumed>",))


def test_headline_numbers(ab):
    a, b = ab
    h = headline.ab_headline(a, b, bw_bytes_per_s=55_900 * MB)
    assert (h.tiles_a, h.tiles_b) == (60, 0)
    assert h.tile_bytes_a == 60 * TILE_BYTES == 960 * MIB
    ta, tb = a.bytes_per_token.total, b.bytes_per_token.total
    assert h.tok_per_s_a == pytest.approx(55_900 * MB / ta)
    assert h.speedup == pytest.approx(ta / tb)  # BW cancels
    eq = h.equivalence
    assert eq is not None and eq.fp16_bit_identical and eq.fp32_max_abs_diff == pytest.approx(9.3e-6)
    assert eq.greedy_agree_steps == 8 == eq.steps
    assert h.assumptions == ()  # fp16 weights: nothing assumed about compression
    frame = headline.headline_frame(h)
    assert frame.set_index("what").loc["tile ops"].to_dict() == {"a": 60, "b": 0, "unit": "ops"}


def test_equivalence_only_between_variants_of_one_source(ab):
    a, b = ab
    assert headline.equivalence_summary(a, a) is None  # same variant
    other = replace(b, build=build_info("qfold", 30, ctx=256))
    assert headline.equivalence_summary(a, other) is None  # different ctx: a different build pair
    no_build = replace(b, build=None)
    assert headline.equivalence_summary(a, no_build) is None  # a package: no spec
    mismatch = replace(b, build=replace(b.build, equivalence=equivalence(fp16_identical=False)))
    assert headline.equivalence_summary(replace(a, build=replace(a.build, equivalence=None)),
                                        mismatch).fp16_bit_identical is False


def test_report_with_a_compressed_side_states_its_assumptions():
    program = decode_program("qfold", 2)
    a = replace(decode_analysis("qfold", 2), program=program)
    h = headline.ab_headline(a, a, bw_bytes_per_s=55_900 * MB)
    assert h.assumptions == ()  # no constexpr weight in the synthetic program
    html = report.build_report(a, a)
    assert "Assumed:" not in html


def test_report_has_headline_charts_and_is_self_contained(ab, section):
    a, b = ab
    when = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    html = report.build_report(a, b, label_a="repeat_kv <A>", label_b="qfold & B", bandwidth=section,
                               generated_at=when)
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    for text in ("60 → 0", "960 → 0 MiB", "(= bytes A ÷ bytes B)", "fp16 bit-identical", "greedy agreement 8/8",
                 "No Core ML runtime on Linux", "2026-11-30 12:00 UTC", "Bandwidth model"):
        assert text in html, text
    assert "repeat_kv &lt;A&gt;" in html and "qfold &amp; B" in html and "<A>" not in html
    assert "&lt;these&gt;" in html and "&lt;assumed&gt;" in html  # verdicts and assumptions are escaped too
    assert not REMOTE_SCRIPT.search(html) and not REMOTE_LINK.search(html)
    # plotly.js is embedded once, then every chart reuses it
    assert len(re.findall(r"plotly\.js v\d", html)) == 1 and len(html) > 1_000_000
    assert html.count("window.PlotlyConfig") == 1
    assert html.count('class="plotly-graph-div"') == 6  # waterfall, ops, layers, bandwidth, inferred, residuals


def test_report_without_bandwidth_section(ab):
    html = report.build_report(*ab)
    assert 'class="plotly-graph-div"' in html and "Bandwidth model" not in html


def test_report_of_the_shipped_default_reproduces_the_writeup():
    a, b = load_shipped("repeat_kv"), load_shipped("qfold")
    html = report.build_report(a, b, label_a="repeat_kv", label_b="qfold")
    assert "60 → 0" in html and "960 → 0 MiB" in html
    h = headline.ab_headline(a, b, bw_bytes_per_s=WRITEUP_AB_IPHONE.bytes_per_s)
    assert h.bytes_per_token_a.replication - h.bytes_per_token_b.replication == 1_920 * MIB


def test_report_of_the_shipped_top8_states_the_assumed_attention_precision():
    from analyzer.analysis.record import read_analysis_file
    from analyzer.report.catalog import SHIPPED_DIR, shipped_name

    a, b = (read_analysis_file(SHIPPED_DIR / shipped_name("exaone-4.0-1.2b", v, "state", 4096, "top8"))
            for v in ("repeat_kv", "qfold"))
    html = report.build_report(a, b)
    assert html.count("Assumed:") == 2  # the attention precision and the weight charge, once for both sides
    assert "A and B: weights compressed (top8): attention int8 in layers 0-3,26-29; pal4 in layers 4-25" in html
    assert "the write-up does not state it" in html and "charged as stored" in html


def test_zip_package_small(tmp_path):
    pkg = tmp_path / "model.mlpackage"
    (pkg / "Data" / "com.apple.CoreML").mkdir(parents=True)
    (pkg / "Manifest.json").write_text("{}")
    (pkg / "Data" / "com.apple.CoreML" / "model.mlmodel").write_bytes(b"\x00" * 1000)
    assert report.package_size_bytes(pkg) == 1002
    data = report.zip_package(pkg)
    assert isinstance(data, bytes)  # what st.download_button's deferred callable may return (not a file object)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        assert sorted(zf.namelist()) == ["model.mlpackage/Data/com.apple.CoreML/model.mlmodel",
                                         "model.mlpackage/Manifest.json"]
