"""The dashboard's pure table and figure builders, on small hand-made analyses whose bytes add up by hand.

Each chart is checked against its own numbers table: what is drawn is what is tabled.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest

from analyzer.device.bandwidth import WRITEUP_AB_IPHONE, crosscheck, fixed_assumption
from analyzer.device.logs import BuildDeviceSummary
from analyzer.fmt import MB, MIB
from analyzer.graph.accounting import CATEGORIES
from analyzer.graph.diff import diff_documents
from analyzer.report import figures

REPO = Path(__file__).resolve().parent.parent
TILE_BYTES = 16 * MIB  # [1, 8, 4, 4096, 64] fp16, the default preset's tile (design.md)


def make_doc(tiles: int, layers: int = 2, weights: int = 3_000, kv: int = 400) -> dict:
    """An analysis document: ``tiles`` kv_replication tiles of 16 MiB spread over ``layers`` layers."""
    per_layer = []
    for layer in range(layers):
        n = tiles // layers
        per_layer.append({"layer": layer, "weights": weights, "kv_read": kv, "kv_write": 2, "replication":
                          2 * n * TILE_BYTES, "activations": 100})
    per_layer.append({"layer": None, "weights": 5_000, "kv_read": 0, "kv_write": 0, "replication": 0,
                      "activations": 10})
    for r in per_layer:
        r["total"] = sum(r[c] for c in CATEGORIES)
    totals = {c: sum(r[c] for r in per_layer) for c in CATEGORIES}
    totals["kv_write_value_semantics"] = 8 * kv
    totals["total"] = sum(totals[c] for c in CATEGORIES)
    tile_rows = [{"name": f"tile_{i}", "layer": i % layers, "input_shape": [1, 8, 1, 4096, 64],
                  "output_shape": [1, 8, 4, 4096, 64], "dtype": "fp16", "output_bytes": TILE_BYTES,
                  "kind": "kv_replication"} for i in range(tiles)]
    counts = {"const": 100 + 2 * tiles, "matmul": 4, "tile": tiles, "expand_dims": tiles, "reshape": 6}
    counts = {k: v for k, v in counts.items() if v}
    total_ops = sum(counts.values())
    return {
        "summary": {"total_ops": total_ops, "const_ops": counts["const"], "non_const_ops": total_ops - counts["const"],
                    "op_counts": counts, "tile_count": tiles, "tile_output_bytes": tiles * TILE_BYTES,
                    "kv_replication_tiles": tiles, "tiles": tile_rows},
        "bytes": {"bytes_per_token": totals, "bytes_by_layer": per_layer, "unruled_op_types": []},
    }


@pytest.fixture
def docs() -> tuple[dict, dict]:
    return make_doc(tiles=4), make_doc(tiles=0)


def test_category_frame_and_waterfall_add_up(docs):
    a, b = docs
    frame = figures.category_frame(diff_documents(a, b))
    assert list(frame["category"]) == [*CATEGORIES, "total", "kv_write_value_semantics"]
    row = frame.set_index("category").loc["replication"]
    assert row["a_bytes"] == 4 * 2 * TILE_BYTES and row["b_bytes"] == 0 and row["delta_bytes"] == -8 * TILE_BYTES
    assert frame[frame["in_total"]]["delta_bytes"].sum() == frame.set_index("category").loc["total", "delta_bytes"]

    fig = figures.waterfall_figure(frame, "repeat_kv", "qfold")
    (trace,) = fig.data
    assert trace.type == "waterfall"
    assert list(trace.measure) == ["absolute", *["relative"] * len(CATEGORIES), "total"]
    assert list(trace.customdata) == [a["bytes"]["bytes_per_token"]["total"],
                                      *frame[frame["in_total"]]["delta_bytes"], b["bytes"]["bytes_per_token"]["total"]]
    assert trace.y[0] == pytest.approx(a["bytes"]["bytes_per_token"]["total"] / MIB)
    assert sum(trace.y[:-1]) == pytest.approx(trace.y[-1])  # A + every change = B
    assert trace.text[CATEGORIES.index("weights") + 1] == ""  # unchanged categories carry no label


def test_category_bars_match_table(docs):
    frame = figures.category_frame(diff_documents(*docs))
    fig = figures.category_bars_figure(frame)
    assert [t.name for t in fig.data] == ["A", "B"]
    cats = frame[frame["in_total"]]
    assert list(fig.data[0].customdata) == list(cats["a_bytes"])
    assert list(fig.data[1].y) == pytest.approx(list(cats["b_bytes"] / MIB))


def test_op_count_frame_and_figure(docs):
    diff = diff_documents(*docs)
    frame = figures.op_count_frame(diff)
    assert frame.iloc[0]["type"] == "const"  # sorted by the larger count
    changed = figures.op_count_frame(diff, changed_only=True)
    assert set(changed["type"]) == {"const", "tile", "expand_dims"}
    assert changed.set_index("type").loc["tile"].to_dict() == {"a": 4, "b": 0, "delta": -4}
    fig = figures.op_count_figure(changed, "A", "B")
    assert [t.type for t in fig.data] == ["bar", "bar"]
    assert fig.layout.barmode == "group"
    assert list(fig.data[0].y) == list(changed["a"]) and list(fig.data[1].y) == list(changed["b"])
    assert "-4" in fig.data[1].text


def test_op_count_frame_empty_when_nothing_changed():
    doc = make_doc(tiles=2)
    frame = figures.op_count_frame(diff_documents(doc, doc), changed_only=True)
    assert frame.empty and list(frame.columns) == ["type", "a", "b", "delta"]


def test_tile_frame(docs):
    a, b = docs
    tiles = figures.tile_frame(a)
    assert list(tiles.columns) == list(figures.TILE_COLUMNS)
    assert len(tiles) == 4 and int(tiles["output_bytes"].sum()) == 4 * TILE_BYTES
    assert tiles.iloc[0]["output_shape"] == "[1, 8, 4, 4096, 64]"
    assert figures.tile_frame(b).empty


def test_layer_frame_and_side_by_side_figure(docs):
    a, b = docs
    frame = figures.layer_frame(a, b, "A", "B")
    assert list(frame["layer"]) == ["0", "1", "outside"] * 2
    assert frame.groupby("analysis")["total"].sum().to_dict() == {
        "A": a["bytes"]["bytes_per_token"]["total"], "B": b["bytes"]["bytes_per_token"]["total"]}
    fig = figures.layer_figure(frame)
    assert fig.layout.barmode == "stack"
    assert len(fig.data) == 2 * len(CATEGORIES)  # one trace per category per panel
    rep_a = next(t for t in fig.data if t.name == "replication" and t.xaxis == "x")
    assert list(rep_a.customdata) == list(frame[frame["analysis"] == "A"]["replication"])
    assert [ann.text for ann in fig.layout.annotations] == ["A", "B"]


def test_single_analysis_frames(docs):
    a, _ = docs
    per_token = figures.bytes_per_token_frame(a)
    assert per_token[per_token["in_total"]]["bytes"].sum() == a["bytes"]["bytes_per_token"]["total"]
    assert list(figures.bytes_by_layer_frame(a)["layer"]) == ["0", "1", "outside"]


# ---------------------------------------------------------------------------------------------- drill-down
@pytest.fixture
def ops_and_doc() -> tuple[pd.DataFrame, dict]:
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
    ops = figures.op_frame(rows)
    by_layer = []
    for layer in (0, 1, None):
        part = [r for r in rows if r["layer"] == layer]
        by_layer.append({"layer": layer, **{c: sum(r[c] for r in part) for c in CATEGORIES},
                         "total": sum(r["total"] for r in part)})
    totals = {c: sum(r[c] for r in rows) for c in CATEGORIES}
    totals["total"] = sum(totals.values())
    return ops, {"bytes": {"bytes_per_token": totals, "bytes_by_layer": by_layer}}


def test_drilldown_category_sums_to_the_total(ops_and_doc):
    ops, doc = ops_and_doc
    for category in (*CATEGORIES, "total"):
        d = figures.drilldown(ops, doc, category)
        assert d.sum_bytes == doc["bytes"]["bytes_per_token"][category]
        assert d.matches is True
        assert (d.rows["bytes"] != 0).all()
    weights = figures.drilldown(ops, doc, "weights")
    assert list(weights.rows["name"]) == ["head", "lin0", "lin1"]  # largest first, zero rows left out


def test_drilldown_by_layer_and_type(ops_and_doc):
    ops, doc = ops_and_doc
    layer0 = figures.drilldown(ops, doc, "total", layer=0)
    assert set(layer0.rows["name"]) == {"lin0", "tile0"} and layer0.sum_bytes == 520 and layer0.matches
    outside = figures.drilldown(ops, doc, "weights", layer=figures.OUTSIDE_LAYERS)
    assert list(outside.rows["name"]) == ["head"] and outside.matches
    linear = figures.drilldown(ops, doc, "weights", op_type="linear")
    assert linear.sum_bytes == 1_600 and linear.reference_bytes is None and linear.matches is None


def test_drilldown_reports_a_mismatch(ops_and_doc):
    ops, doc = ops_and_doc
    doc["bytes"]["bytes_per_token"]["replication"] += 1
    assert figures.drilldown(ops, doc, "replication").matches is False
    with pytest.raises(ValueError, match="category 'bogus'"):
        figures.drilldown(ops, doc, "bogus")


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
    frame = figures.bandwidth_frame(report)
    assert list(frame.columns) == list(figures.BANDWIDTH_COLUMNS)
    rk = frame.set_index("build").loc["rk"]
    assert round(rk["inferred_bytes_per_token"] / MB) == 2_742  # 55,900 / 20.39 (write-up section 4)
    assert pd.isna(frame.set_index("build").loc["other", "graph_bytes_per_token"])
    pairs = figures.pairs_frame(report)
    assert len(pairs) == 1
    p = pairs.iloc[0]
    assert (p["build_a"], p["build_b"]) == ("rk", "qf")
    assert round(p["inferred_diff_bytes"] / MB) == 1_712 and p["graph_diff_bytes"] == 2_013_265_920
    assert p["gap_pct"] == pytest.approx(-15.0, abs=0.5)  # the write-up's "≈ 15% smaller"


def test_bandwidth_figure_is_log_log_with_the_bw_curve(report):
    frame = figures.bandwidth_frame(report)
    bw = 55_900 * MB
    fig = figures.bandwidth_figure(frame, [figures.BandwidthCurve("BW", bw)])
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
    frame = pd.DataFrame(columns=list(figures.BANDWIDTH_COLUMNS))
    fig = figures.bandwidth_figure(frame, [figures.BandwidthCurve("fit", 50e9, overhead_s=0.01, dash="dash")])
    (curve,) = fig.data
    assert curve.line.dash == "dash"
    assert all(y == pytest.approx(1 / (x * MB / 50e9 + 0.01)) for x, y in zip(curve.x, curve.y, strict=True))


def test_inferred_and_residual_figures_match_the_table(report):
    frame = figures.bandwidth_frame(report)
    inferred_fig = figures.inferred_vs_graph_figure(frame)
    inferred, graph = inferred_fig.data
    assert list(inferred.y) == pytest.approx([int(v) / MB for v in frame["inferred_bytes_per_token"]])
    assert graph.y[-1] is None  # the unmapped build has no graph bar
    residual_fig = figures.residual_figure(frame, threshold_pct=10)
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
