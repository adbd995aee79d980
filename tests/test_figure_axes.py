"""Every chart's axes fit their data (issue 44): each plotly figure the pages draw (read from what the page sends the
browser, in AppTest) with the default pair and with a Core AI pair, every tab of the A/B page, the Bandwidth page
with decode and prefill runs, the Placement tab with a plan per side, and the Sweeps page's two charts. The rules
are tests/figure_axes.py's: the range holds the data, spans at most 3 decades beyond it, and a log axis labels a
tick per decade with its value."""

from __future__ import annotations

import json

import pytest

from analyzer.analysis.record import load_analysis
from analyzer.report import sweep_figures as sf
from analyzer.report.catalog import shipped_analyses
from analyzer.sweep.grid import SweepPoint
from analyzer.sweep.table import SweepRow
from tests.figure_axes import axis_problems, parse_tick
from tests.placement_plans import plan_bytes, slice_update_on_cpu
from tests.test_app import new_app

pytestmark = pytest.mark.conversion

AB = "app_pages/ab.py"
BANDWIDTH = "app_pages/bandwidth.py"
AB_TABS = ("Bytes by category", "Op counts", "Bytes per layer", "Decode · prefill · roofline", "Placement")
PREFILL_LOG = (b"device,build,tok_per_s,phase,prompt_tokens,context_length\n"
               b"iPhone 15 Pro,exaone qfold,620,prefill,64,4096\niPhone 15 Pro,exaone rkv,410,prefill,64,4096\n"
               b"iPhone 15 Pro,exaone qfold,54.3,decode,,4096\niPhone 15 Pro,exaone rkv,20.39,decode,,4096\n")


def page_figures(page: str | None, **state) -> list[tuple[str, dict]]:
    """(where, figure spec) of every plotly chart ``page`` draws with ``state``."""
    at = new_app()
    for key, value in state.items():
        at.session_state[key] = value
    if page not in (None, AB):
        at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    where = f"{page or AB} {state.get('ab_tab', '')}".strip()
    return [(f"{where} · {json.loads(c.proto.spec)['layout'].get('title', {}).get('text', '?')}",
             json.loads(c.proto.spec)) for c in at.get("plotly_chart")]


def ab_figures(a_id: str, b_id: str, plan_a: bytes | None = None, plan_b: bytes | None = None
               ) -> list[tuple[str, dict]]:
    """Every tab of the A/B page on A and B (the Placement tab with a Core ML plan per side when given)."""
    plans = {} if plan_a is None or plan_b is None else {
        "ab_plans": {"a-plan.json": plan_a, "b-plan.json": plan_b}, "ab_plan_choice_A": "a-plan.json",
        "ab_plan_choice_B": "b-plan.json"}
    out = []
    for tab in AB_TABS:
        out += page_figures(AB, ab_a=a_id, ab_b=b_id, ab_tab=tab, **plans)
    return out


def sweep_figures() -> list[tuple[str, dict]]:
    rows = [SweepRow(SweepPoint("m", "none", v, ctx), "built", key=f"{v}{ctx}",
                     bytes=(("total", 10**9 + (10 if v == "repeat_kv" else 2) * 61_440 * ctx),),
                     predicted_tok_per_s=55.9e9 / (10**9 + (10 if v == "repeat_kv" else 2) * 61_440 * ctx))
            for v in ("repeat_kv", "qfold") for ctx in (512, 4096, 32768)]
    frame = sf.sweep_frame(rows)
    return [(f"sweeps · {f.layout.title.text}", json.loads(f.to_json()))
            for f in (sf.tok_per_s_figure(frame), sf.bytes_figure(frame))]


@pytest.fixture(scope="module")
def default_pair_figures(tiny_builds):
    assert {"repeat_kv", "qfold"} <= set(shipped_analyses())
    ids = ("shipped:exaone-4.0-1.2b-repeat_kv-state-ctx4096-top8", "shipped:exaone-4.0-1.2b-qfold-state-ctx4096-top8")
    a, b = (load_analysis(shipped_analyses()[v]) for v in ("repeat_kv", "qfold"))
    figs = ab_figures(*ids, plan_bytes(a, slice_update_on_cpu), plan_bytes(b))
    figs += page_figures(BANDWIDTH)  # the write-up's example log
    mapping = {"exaone qfold": "shipped:exaone-4.0-1.2b-qfold-state-ctx4096",
               "exaone rkv": "shipped:exaone-4.0-1.2b-repeat_kv-state-ctx4096"}
    figs += page_figures(BANDWIDTH, logs_files=[("runs.csv", PREFILL_LOG)], logs_mapping=mapping)
    return figs + sweep_figures()


@pytest.fixture(scope="module")
def coreai_pair_figures(coreai_builds):
    ids = [f"build:{coreai_builds[v].name}" for v in ("repeat_kv", "qfold")]
    log = b"device,build,tok_per_s\nLinux CPU,tiny rkv,49.7\nLinux CPU,tiny qfold,95.0\n"  # bench/coreai.json's rates
    return ab_figures(*ids) + page_figures(BANDWIDTH, logs_files=[("coreai.csv", log)], logs_example=False,
                                           logs_mapping={"tiny rkv": ids[0], "tiny qfold": ids[1]})


def test_every_chart_of_the_default_pair_has_axes_that_fit_its_data(default_pair_figures):
    titles = " ".join(where for where, _ in default_pair_figures)  # the pages drew what this test is about
    for expected in ("Roofline", "Measured tok/s vs bytes per token", "Prefill runs", "Where the ops ran",
                     "Bytes per decode token by layer", "Predicted tok/s vs context length"):
        assert expected in titles, titles
    problems = [p for where, spec in default_pair_figures for p in axis_problems(spec, where)]
    assert not problems, "\n".join(problems)


def test_every_chart_of_a_core_ai_pair_has_axes_that_fit_its_data(coreai_pair_figures):
    assert any("Roofline" in where for where, _ in coreai_pair_figures)
    assert any("Measured tok/s vs bytes per token" in where for where, _ in coreai_pair_figures)
    problems = [p for where, spec in coreai_pair_figures for p in axis_problems(spec, where)]
    assert not problems, "\n".join(problems)


def test_the_axis_checker_catches_what_the_issue_saw():
    """The two axes of issue 44: an annotation at x=300 on a log axis (plotly reads it as 10^300) and plotly's own
    log ticks over a decade (labelled 2, 3, … 9, 100)."""
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[0.5, 300.0], y=[1e9, 1e13]))
    fig.add_vline(x=300.0, annotation_text="ridge")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log", range=[8, 14], tickvals=[1e9, 1e10, 1e11, 1e12, 1e13], ticktext=["1G", "10G", "100G",
                                                                                                   "1T", "10T"])
    problems = axis_problems(json.loads(fig.to_json()))
    assert any("xaxis" in p and "decades beyond" in p for p in problems), problems
    assert not any("yaxis" in p for p in problems), problems
    fig = go.Figure(go.Scatter(x=[1, 2], y=[20.39, 54.3]))
    fig.update_yaxes(type="log", range=[1.0, 2.04])
    assert any("no tick values of its own" in p for p in axis_problems(json.loads(fig.to_json())))
    fig.update_yaxes(tickvals=[20, 50, 100], ticktext=["2", "5", "100"])
    assert any("tick 20 is labelled '2'" in p for p in axis_problems(json.loads(fig.to_json())))
    assert [parse_tick(t) for t in ("1,000", "20k", "0.5", "1T", "x")] == [1000, 20000, 0.5, 1e12, None]
