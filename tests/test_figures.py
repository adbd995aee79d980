"""The dashboard's pure table and figure builders, on small hand-made analyses whose bytes add up by hand.

Each chart is checked against its own numbers table: what is drawn is what is tabled.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest

from analyzer.analysis.accounting import CATEGORIES
from analyzer.compare.diff import diff_analyses
from analyzer.fmt import MB, MIB
from analyzer.measure.logs import BuildDeviceSummary
from analyzer.predict.bandwidth_model import WRITEUP_AB_IPHONE, fixed_assumption
from analyzer.predict.crosscheck import crosscheck
from analyzer.report import bandwidth_figures, figures
from tests.synthetic import TILE_BYTES, decode_analysis

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def analyses():
    """repeat_kv with 4 tiles (2 layers × K and V) and qfold with none."""
    return decode_analysis("repeat_kv", 2), decode_analysis("qfold", 2)


def test_category_frame_and_waterfall_add_up(analyses):
    a, b = analyses
    frame = figures.category_frame(diff_analyses(a, b))
    assert list(frame["category"]) == [*CATEGORIES, "total", "kv_write_value_semantics"]
    row = frame.set_index("category").loc["replication"]
    assert row["a_bytes"] == 4 * 2 * TILE_BYTES and row["b_bytes"] == 0 and row["delta_bytes"] == -8 * TILE_BYTES
    assert frame[frame["in_total"]]["delta_bytes"].sum() == frame.set_index("category").loc["total", "delta_bytes"]

    fig = figures.waterfall_figure(frame, "repeat_kv", "qfold")
    (trace,) = fig.data
    assert trace.type == "waterfall"
    assert list(trace.measure) == ["absolute", *["relative"] * len(CATEGORIES), "total"]
    assert list(trace.customdata) == [a.bytes_per_token.total, *frame[frame["in_total"]]["delta_bytes"],
                                      b.bytes_per_token.total]
    assert trace.orientation == "h" and trace.y[0] == "repeat_kv total" and trace.y[-1] == "qfold total"
    assert trace.x[0] == pytest.approx(a.bytes_per_token.total / MIB)  # 145 MiB: drawn in MiB
    assert fig.layout.xaxis.title.text == "MiB per token"
    assert sum(trace.x[:-1]) == pytest.approx(trace.x[-1])  # A + every change = B
    assert trace.text[CATEGORIES.index("weights") + 1] == ""  # unchanged categories carry no label
    assert trace.text[CATEGORIES.index("replication") + 1] == "-128"


def test_category_bars_match_table(analyses):
    frame = figures.category_frame(diff_analyses(*analyses))
    fig = figures.category_bars_figure(frame)
    assert [t.name for t in fig.data] == ["A", "B"]
    cats = frame[frame["in_total"]]
    assert list(fig.data[0].customdata) == list(cats["a_bytes"])
    assert list(fig.data[1].y) == pytest.approx(list(cats["b_bytes"] / MIB))


def test_op_count_frame_and_figure(analyses):
    diff = diff_analyses(*analyses)
    frame = figures.op_count_frame(diff)
    assert frame.iloc[0]["type"] == "reshape"  # sorted by the larger count
    changed = figures.op_count_frame(diff, changed_only=True)
    assert set(changed["type"]) == {"reshape", "tile", "expand_dims"}
    assert changed.set_index("type").loc["tile"].to_dict() == {"a": 4, "b": 0, "delta": -4}
    fig = figures.op_count_figure(changed, "A", "B")
    assert [t.type for t in fig.data] == ["bar", "bar"]
    assert fig.layout.barmode == "group"
    assert list(fig.data[0].y) == list(changed["a"]) and list(fig.data[1].y) == list(changed["b"])
    assert "-4" in fig.data[1].text


def test_op_count_frame_empty_when_nothing_changed(analyses):
    a, _ = analyses
    frame = figures.op_count_frame(diff_analyses(a, a), changed_only=True)
    assert frame.empty and list(frame.columns) == ["type", "a", "b", "delta"]


def test_tile_frame(analyses):
    a, b = analyses
    tiles = figures.tile_frame(a)
    assert list(tiles.columns) == list(figures.TILE_COLUMNS)
    assert len(tiles) == 4 and int(tiles["output_bytes"].sum()) == 4 * TILE_BYTES
    assert tiles.iloc[0]["output_shape"] == "[1, 8, 4, 4096, 64]"
    assert list(tiles["layer"]) == [0, 0, 1, 1]
    assert figures.tile_frame(b).empty


def test_layer_frame_and_side_by_side_figure(analyses):
    a, b = analyses
    frame = figures.layer_frame(a, b, "A", "B")
    assert list(frame["layer"]) == ["0", "1", "outside"] * 2
    assert frame.groupby("analysis")["total"].sum().to_dict() == {"A": a.bytes_per_token.total,
                                                                  "B": b.bytes_per_token.total}
    fig = figures.layer_figure(frame)
    assert fig.layout.barmode == "stack"
    assert len(fig.data) == 2 * len(CATEGORIES)  # one trace per category per panel
    rep_a = next(t for t in fig.data if t.name == "replication" and t.xaxis == "x")
    assert list(rep_a.customdata) == list(frame[frame["analysis"] == "A"]["replication"])
    assert [ann.text for ann in fig.layout.annotations] == ["A", "B"]


def test_single_analysis_frames(analyses):
    a, _ = analyses
    per_token = figures.bytes_per_token_frame(a)
    assert per_token[per_token["in_total"]]["bytes"].sum() == a.bytes_per_token.total
    assert list(figures.bytes_by_layer_frame(a)["layer"]) == ["0", "1", "outside"]


# ---------------------------------------------------------------------------------------------- drill-down
@pytest.fixture
def ops() -> pd.DataFrame:
    rows = [
        {"index": 0, "name": "w", "type": "const", "layer": None, "rule": "const", "weights": 0, "kv_read": 0,
         "kv_write": 0, "replication": 0, "activations": 0, "total": 0, "kv_write_value_semantics": 0},
        {"index": 1, "name": "lin0", "type": "linear", "layer": 0, "rule": "compute", "weights": 300,
         "kv_read": 0, "kv_write": 0, "replication": 0, "activations": 20, "total": 320,
         "kv_write_value_semantics": 0},
        {"index": 2, "name": "tile0", "type": "tile", "layer": 0, "rule": "tile", "weights": 0, "kv_read": 40,
         "kv_write": 0, "replication": 160, "activations": 0, "total": 200, "kv_write_value_semantics": 0},
        {"index": 3, "name": "lin1", "type": "linear", "layer": 1, "rule": "compute", "weights": 300,
         "kv_read": 0, "kv_write": 0, "replication": 0, "activations": 20, "total": 320,
         "kv_write_value_semantics": 0},
        {"index": 4, "name": "head", "type": "linear", "layer": None, "rule": "compute", "weights": 1_000,
         "kv_read": 0, "kv_write": 0, "replication": 0, "activations": 8, "total": 1_008,
         "kv_write_value_semantics": 0},
    ]
    return figures.op_frame(rows)


def test_drilldown_keeps_the_ops_that_move_the_category(ops):
    weights = figures.drilldown(ops, "weights")
    assert list(weights.rows["name"]) == ["head", "lin0", "lin1"]  # largest first, zero rows left out
    assert weights.sum_bytes == 1_600 and (weights.rows["bytes"] != 0).all()
    assert figures.drilldown(ops, "total").sum_bytes == 320 + 200 + 320 + 1_008


def test_drilldown_by_layer_and_type(ops):
    layer0 = figures.drilldown(ops, "total", layer=0)
    assert set(layer0.rows["name"]) == {"lin0", "tile0"} and layer0.sum_bytes == 520
    outside = figures.drilldown(ops, "weights", layer=figures.OUTSIDE_LAYERS)
    assert list(outside.rows["name"]) == ["head"]
    linear = figures.drilldown(ops, "weights", op_type="linear")
    assert linear.sum_bytes == 1_600
    with pytest.raises(ValueError, match="category 'bogus'"):
        figures.drilldown(ops, "bogus")


def test_drilldown_of_a_real_account_covers_every_byte(analyses):
    a, _ = analyses
    ops = figures.op_frame(a.account.op_rows())
    for category in (*CATEGORIES, "total"):
        assert figures.drilldown(ops, category).sum_bytes == a.bytes_per_token.get(category)
    layer1 = figures.drilldown(ops, "replication", layer=1)
    assert layer1.sum_bytes == 2 * 2 * TILE_BYTES and set(layer1.rows["type"]) == {"tile", "matmul"}


# ---------------------------------------------------------------------------------------------- bandwidth
AB_DEVICE = "iPhone (A/B device)"


@pytest.fixture
def report():
    summaries = [
        BuildDeviceSummary("rk", AB_DEVICE, 1, 20.39, 0.0, 20.39, 20.39),
        BuildDeviceSummary("qf", AB_DEVICE, 1, 54.30, 0.0, 54.30, 54.30),
        BuildDeviceSummary("other", "iPhone 16 Pro", 1, 44.0, 0.0, 44.0, 44.0),
    ]
    graph = {"rk": 4_896_997_490, "qf": 4_896_997_490 - 2_013_265_920}
    return crosscheck(summaries, graph, fixed_assumption(WRITEUP_AB_IPHONE.bytes_per_s))


def test_bandwidth_frame_and_pairs(report):
    frame = bandwidth_figures.bandwidth_frame(report)
    assert list(frame.columns) == list(bandwidth_figures.BANDWIDTH_COLUMNS)
    rk = frame.set_index("build").loc["rk"]
    assert round(rk["inferred_bytes_per_token"] / MB) == 2_742  # 55,900 / 20.39 (write-up section 4)
    assert pd.isna(frame.set_index("build").loc["other", "graph_bytes_per_token"])
    pairs = bandwidth_figures.pairs_frame(report)
    assert len(pairs) == 1
    p = pairs.iloc[0]
    assert (p["build_a"], p["build_b"]) == ("rk", "qf")
    assert round(p["inferred_diff_bytes"] / MB) == 1_712 and p["graph_diff_bytes"] == 2_013_265_920
    assert p["gap_pct"] == pytest.approx(-15.0, abs=0.5)  # the write-up's "≈ 15% smaller"


def test_bandwidth_figure_is_log_log_with_the_bw_curve(report):
    frame = bandwidth_figures.bandwidth_frame(report)
    bw = 55_900 * MB
    fig = bandwidth_figures.bandwidth_figure(frame, [bandwidth_figures.BandwidthCurve("BW", bw)])
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"
    measured = next(t for t in fig.data if t.name == AB_DEVICE)
    mapped = frame[frame["graph_bytes_per_token"].notna()]
    assert list(measured.x) == pytest.approx([int(v) / MB for v in mapped["graph_bytes_per_token"]])
    assert list(measured.y) == list(mapped["measured_tok_per_s"])
    assert "other" not in measured.text  # unmapped: no graph bytes, not placed
    inferred = next(t for t in fig.data if t.name == f"{AB_DEVICE}: inferred bytes")
    curve = next(t for t in fig.data if t.name == "BW")
    assert all(y == pytest.approx(bw / (x * MB)) for x, y in zip(curve.x, curve.y, strict=True))
    # inferred bytes sit on the curve by construction: tok/s × inferred = BW
    assert all(x * MB * y == pytest.approx(bw, rel=1e-6) for x, y in zip(inferred.x, inferred.y, strict=True))
    assert min(curve.x) < min(measured.x) and max(curve.x) > max(measured.x)


def test_bandwidth_curve_with_overhead():
    frame = pd.DataFrame(columns=list(bandwidth_figures.BANDWIDTH_COLUMNS))
    curve = bandwidth_figures.BandwidthCurve("fit", 50e9, overhead_s=0.01, dash="dash")
    fig = bandwidth_figures.bandwidth_figure(frame, [curve])
    (curve,) = fig.data
    assert curve.line.dash == "dash"
    assert all(y == pytest.approx(1 / (x * MB / 50e9 + 0.01)) for x, y in zip(curve.x, curve.y, strict=True))


def test_inferred_and_residual_figures_match_the_table(report):
    frame = bandwidth_figures.bandwidth_frame(report)
    inferred_fig = bandwidth_figures.inferred_vs_graph_figure(frame)
    inferred, graph = inferred_fig.data
    assert list(inferred.y) == pytest.approx([int(v) / MB for v in frame["inferred_bytes_per_token"]])
    assert graph.y[-1] is None  # the unmapped build has no graph bar
    residual_fig = bandwidth_figures.residual_figure(frame, threshold_pct=10)
    (bars,) = residual_fig.data
    mapped = frame[frame["residual_pct"].notna()]
    assert list(bars.y) == pytest.approx(list(mapped["residual_pct"]))
    assert len(bars.x) == 2


# ---------------------------------------------------------------------------------------------- boundaries
def test_analyzer_never_imports_streamlit():
    offenders = []
    for path in sorted((REPO / "analyzer").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] == "streamlit"]
    assert offenders == []
