"""The dashboard with decode+prefill packages: the A/B page's decode · prefill · roofline tab (both phases of A
and B side by side, the bound, the roofline chart, time to first token), the FLOPs table, the Builds page (one row
per function), and the Bandwidth page's prefill runs against the compute roof."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from analyzer.analysis.record import load_analyses

from .test_app import TIMEOUT_S, new_app, texts

pytestmark = pytest.mark.conversion
TAB = "Decode · prefill · roofline"


def _ref_id(folder, function):
    return f"build:{folder.name}#{function}"


def _open(page: str | None = None, **state) -> AppTest:
    at = new_app(TIMEOUT_S)
    for key, value in state.items():
        at.session_state[key] = value
    at.run()
    if page is not None:
        at.switch_page(page)
        at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_ab_tab_shows_decode_and_prefill_side_by_side(tiny_phase_builds):
    rkv, qf = tiny_phase_builds["repeat_kv"], tiny_phase_builds["qfold"]
    at = _open(ab_a=_ref_id(rkv, "decode"), ab_b=_ref_id(qf, "decode"), ab_tab=TAB)
    table = next(d.value for d in at.dataframe if "bound" in d.value.columns)
    assert list(zip(table["side"], table["phase"], strict=True)) == [
        ("A", "decode"), ("A", "prefill"), ("B", "decode"), ("B", "prefill")]
    assert list(table["KV tiles"]) == [4, 4, 0, 0]
    assert list(table["tokens/call"]) == [1, 64, 1, 64]
    flops = {f.function: f.flops.per_call().total for f in load_analyses(qf)}
    assert list(table["GFLOP/call"]) == pytest.approx([flops["decode"] / 1e9, flops["prefill"] / 1e9] * 2)
    assert set(table["bound"]) <= {"memory", "compute"}
    assert any(c.proto.spec and "Roofline" in c.proto.spec for c in at.get("plotly_chart"))
    ttft = [t for t in texts(at.markdown) if "prefill call(s) of 64 tokens" in t]
    assert len(ttft) == 2 and all("decode" in t and "tok/s" in t for t in ttft)  # 512 tokens = 8 calls of 64
    assert all("8 prefill call(s)" in t for t in ttft)
    assert any(e.label.startswith("FLOPs per token by category") for e in at.expander)


def test_a_decode_build_finds_its_prefill_in_a_package_of_the_same_spec(tiny_phase_builds, tiny_builds):
    at = _open(ab_a=f"build:{tiny_builds['repeat_kv'].name}", ab_b=_ref_id(tiny_phase_builds["qfold"], "decode"),
               ab_tab=TAB)
    table = next(d.value for d in at.dataframe if "bound" in d.value.columns)
    assert ("A", "prefill") in set(zip(table["side"], table["phase"], strict=True))


def test_ab_tab_says_when_a_side_has_no_prefill(tiny_phase_builds, tiny_builds):
    package = tiny_builds["qfold"] / "model.mlpackage"  # a package analysed as another tool's: one decode function
    at = _open(builds_packages=[str(package)], ab_a=f"package:{package.resolve()}",
               ab_b=_ref_id(tiny_phase_builds["qfold"], "decode"), ab_tab=TAB)
    assert any(i.value.startswith("A has no prefill analysis") for i in at.info)
    table = next(d.value for d in at.dataframe if "bound" in d.value.columns)
    assert list(zip(table["side"], table["phase"], strict=True)) == [("A", "decode"), ("B", "decode"),
                                                                       ("B", "prefill")]


def test_roof_profile_and_peak_are_editable(tiny_phase_builds):
    rkv, qf = tiny_phase_builds["repeat_kv"], tiny_phase_builds["qfold"]
    at = _open(ab_a=_ref_id(rkv, "prefill"), ab_b=_ref_id(qf, "prefill"), ab_tab=TAB)
    peak = next(n for n in at.number_input if n.label == "Peak (TFLOP/s)")
    peak.set_value(0.01).run()  # a tiny compute roof: prefill becomes compute-bound
    table = next(d.value for d in at.dataframe if "bound" in d.value.columns)
    assert set(table[table["phase"] == "prefill"]["bound"]) == {"compute"}
    assert any("(edited)" in t for t in texts(at.markdown))


def test_builds_page_lists_every_function(tiny_phase_builds):
    at = _open("app_pages/builds.py")
    table = next(d.value for d in at.dataframe if "function" in d.value.columns)
    functions = set(zip(table["key"], table["function"], strict=True))
    for folder in tiny_phase_builds.values():
        assert {(f"{folder.name}#decode", "decode"), (f"{folder.name}#prefill", "prefill")} <= functions


def test_bandwidth_page_holds_prefill_runs_against_the_compute_roof(tiny_phase_builds):
    log = (b"device,build,tok_per_s,phase,prompt_tokens,context_length\n"
           b"M5,tiny-qfold,900,prefill,64,256\nM5,tiny-qfold,40,decode,,256\nM5,tiny-rkv,30,decode,,256\n")
    mapping = {"tiny-qfold": _ref_id(tiny_phase_builds["qfold"], "decode"),
               "tiny-rkv": _ref_id(tiny_phase_builds["repeat_kv"], "decode")}
    at = _open("app_pages/bandwidth.py", logs_files=[("p.csv", log)], logs_mapping=mapping)
    assert "Prefill runs against the compute roof" in [s.value for s in at.subheader]
    runs = next(d.value for d in at.dataframe if "implied_flops_per_s" in d.value.columns)
    (row,) = runs.itertuples()
    prefill = next(a for a in load_analyses(tiny_phase_builds["qfold"]) if a.function == "prefill")
    assert row.flops_per_token == prefill.flops.per_token().total
    assert row.implied_flops_per_s == pytest.approx(900 * prefill.flops.per_token().total)


def test_the_default_pair_finds_the_shipped_prefill_pair_at_the_pages_one_bandwidth(tiny_builds):
    """The A/B opens on the pair the example log measured (top8); qfold ships the fp16 prefill-64 analyses of both
    variants: the tab finds them, says how they differ, and predicts at the headline's bandwidth."""
    from analyzer.analysis.record import load_analysis
    from analyzer.report.bandwidth_setting import BandwidthSetting
    from analyzer.report.catalog import catalog

    refs = {r.id: r for r in catalog()}
    a, b = (load_analysis(refs[f"shipped:exaone-4.0-1.2b-{v}-state-ctx4096-top8"].path) for v in ("repeat_kv", "qfold"))
    at = _open(ab_tab=TAB)
    table = next(d.value for d in at.dataframe if "bound" in d.value.columns)
    assert list(zip(table["side"], table["phase"], strict=True)) == [
        ("A", "decode"), ("A", "prefill"), ("B", "decode"), ("B", "prefill")]
    assert list(table["tokens/call"]) == [1, 64, 1, 64] and list(table["KV tiles"]) == [60, 60, 0, 0]
    assert not any("has no prefill" in i.value for i in at.info)
    assert sum("compression fp16, not top8" in c for c in texts(at.caption)) == 2  # said for A and for B
    assert not any("--" in str(i.value) for i in at.info)  # settings, never flags
    bw = next(n for n in at.number_input if n.label == "Bandwidth (GB/s)")
    assert bw.value == pytest.approx(55.9)  # the write-up's 55,900 MB/s: the headline's bandwidth
    decode = table[table["phase"] == "decode"]["tok/s"]
    assert list(decode) == pytest.approx([55.9e9 / a.bytes_per_token.total, 55.9e9 / b.bytes_per_token.total])
    assert any("(the page's setting)" in t for t in texts(at.markdown))
    at = _open(ab_tab=TAB, bw_setting=BandwidthSetting("typed", typed_mb_per_s=70_000.0))  # another setting
    assert next(n for n in at.number_input if n.label == "Bandwidth (GB/s)").value == pytest.approx(70.0)
    table = next(d.value for d in at.dataframe if "bound" in d.value.columns)
    assert table[table["phase"] == "decode"]["tok/s"].iloc[0] == pytest.approx(70e9 / a.bytes_per_token.total)
