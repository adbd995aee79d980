"""The Sweeps page's figure builders (called directly) and the page itself (AppTest) on a finished sweep."""

from __future__ import annotations

import pandas as pd
import pytest

from analyzer.fmt import MB
from analyzer.measure.logs import Measurement
from analyzer.report import sweep_figures as sf
from analyzer.sweep.driver import SweepJob
from analyzer.sweep.grid import SweepPoint, make_spec
from analyzer.sweep.table import SweepRow, read_table, write_table
from tests.conftest import TINY_CTX
from tests.test_app import new_app


def _rows() -> list[SweepRow]:
    rows = []
    for v in ("repeat_kv", "qfold"):
        for ctx in (512, 1024, 2048):
            total = 1_000_000_000 + (10 if v == "repeat_kv" else 2) * 61_440 * ctx
            rows.append(SweepRow(SweepPoint("m", "none", v, ctx), "built", key=f"{v}{ctx}",
                                 bytes=(("weights", 10**9), ("total", total)), predicted_tok_per_s=55.9e9 / total,
                                 device_profile="writeup-ab-iphone", tile_count=4 if v == "repeat_kv" else 0))
    rows.append(SweepRow(SweepPoint("m", "none", "qfold", 4096), "failed", error="boom"))
    return rows


def test_frames_keep_finished_points_and_figures_draw_exactly_them():
    frame = sf.sweep_frame(_rows())
    assert len(frame) == 6 and set(frame["status"]) == {"built"}
    assert list(dict.fromkeys(frame["line"])) == ["m · qfold · none", "m · repeat_kv · none"]
    measured = sf.measured_frame([Measurement("f", 2, "iPhone", "exa", 20.0, context_length=1024),
                                  Measurement("f", 3, "iPhone", "exa", 30.0, context_length=1024),
                                  Measurement("f", 4, "iPhone", "exa", 25.0)])  # no ctx: cannot be placed
    assert len(measured) == 1 and measured["tok_per_s"].iloc[0] == pytest.approx(24.0)
    fig = sf.tok_per_s_figure(frame, measured, "write-up")
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    assert "context length" in fig.layout.xaxis.title.text and "tok/s" in fig.layout.yaxis.title.text
    lines = [t for t in fig.data if t.mode == "lines+markers"]
    assert [t.name for t in lines] == ["m · qfold · none", "m · repeat_kv · none"]
    rk = frame[frame["variant"] == "repeat_kv"]
    assert list(lines[1].y) == pytest.approx(list(rk["predicted_tok_per_s"]))
    assert next(t for t in fig.data if t.name == "measured: iPhone · exa").y == pytest.approx((24.0,))
    bfig = sf.bytes_figure(frame)
    assert "MB" in bfig.layout.yaxis.title.text
    qfold = frame[frame["variant"] == "qfold"]
    assert list(bfig.data[0].y) == pytest.approx([int(v) / MB for v in qfold["bytes_total"]])
    assert sf.sweep_frame(pd.DataFrame()).empty


def test_derived_points_are_open_markers_whose_hover_and_legend_say_where_they_came_from(tmp_path):
    rows = _rows()[:3]
    total = 1_000_000_000 + 10 * 61_440 * 4096
    rows.append(SweepRow(SweepPoint("m", "none", "repeat_kv", 4096), "derived", key="rk4096", derived_from_ctx=(
        512, 1024, 2048), bytes=(("total", total),), predicted_tok_per_s=55.9e9 / total, tile_count=4))
    for table in (rows, read_table(write_table(rows, tmp_path / "t.csv"))):  # live rows, and the table read back
        frame = sf.sweep_frame(table)
        assert list(frame["status"]) == ["built", "built", "built", "derived"]
        assert list(frame["provenance"]) == ["converted"] * 3 + ["derived from ctx 512 and 1024 (checked at ctx 2048)"]
        fig = sf.bytes_figure(frame)
        line = fig.data[0]
        assert list(line.marker.symbol) == ["circle"] * 3 + ["circle-open"]
        assert line.customdata[-1] == "derived from ctx 512 and 1024 (checked at ctx 2048)"
        assert "%{customdata}" in line.hovertemplate
        assert [t.name for t in fig.data][-1] == sf.DERIVED_LEGEND
    assert sf.DERIVED_LEGEND not in [t.name for t in sf.bytes_figure(sf.sweep_frame(rows[:3])).data]


@pytest.mark.conversion
def test_sweeps_page_follows_a_finished_sweep_and_shows_its_charts(tiny_analysis_builds, builds_root):
    """A sweep of the tiny pair's two points, both already built (the session's analysis-mode pair)."""
    spec = make_spec({"ctx": [TINY_CTX], "structure": True, "set": ["num_hidden_layers=2"]})
    job = SweepJob(spec, builds_root).start()
    job._thread.join(timeout=120)
    rows, finished, error, _messages = job.snapshot()
    assert finished and error is None and {r.status for r in rows} == {"reused"}
    at = new_app(120)
    at.session_state["sweeps_job"] = job
    at.run()
    at.switch_page("app_pages/sweeps.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.title[0].value == "Sweeps"
    assert len(at.get("plotly_chart")) == 2
    shown = next(d.value for d in at.dataframe if "line" in d.value.columns)
    assert set(shown["variant"]) == {"repeat_kv", "qfold"} and set(shown["ctx"]) == {TINY_CTX}


def test_sweeps_page_opens_with_nothing_to_show():
    at = new_app(120)
    at.run()
    at.switch_page("app_pages/sweeps.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Define a sweep" in str(i.value) for i in at.info)
