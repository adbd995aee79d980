"""The graph view's pure functions on the shipped full-size analyses: what is drawn, the row alignment, the DOT
and the SVG Graphviz makes of it, the frames behind the picture, and hostile op names."""

from __future__ import annotations

import functools
import re
from collections import Counter
from dataclasses import replace

import pytest

from analyzer.analysis.accounting import account
from analyzer.analysis.record import load_analysis
from analyzer.compare.structdiff import home_layers, is_const_like, structural_diff
from analyzer.errors import QfoldError
from analyzer.ir.coreml.mil_reader import MilProgram
from analyzer.report import graphview as gv
from analyzer.report.catalog import SHIPPED_DIR

REPEAT_KV = "exaone-4.0-1.2b-repeat_kv-state-ctx4096"
QFOLD = "exaone-4.0-1.2b-qfold-state-ctx4096"
needs_dot = pytest.mark.skipif(gv.dot_binary() is None, reason="Graphviz 'dot' is not installed")


@functools.cache
def _load(stem: str) -> MilProgram:
    return load_analysis(SHIPPED_DIR / f"{stem}.analysis.json").program


@pytest.fixture(scope="module")
def pair() -> tuple[MilProgram, MilProgram]:
    return _load(REPEAT_KV), _load(QFOLD)


@pytest.fixture(scope="module")
def view0(pair) -> gv.LayerView:
    return gv.layer_view(*pair, 0, label_a="repeat_kv", label_b="qfold")


def _drawn(program: MilProgram, layer: int | None) -> list[int]:
    homes = home_layers(program)
    return [op.index for op in program.ops if homes[op.index] == layer and not is_const_like(op)]


def test_layer0_draws_the_two_kv_tiles_on_the_repeat_kv_side_only(pair, view0):
    a, b = view0.sides
    tiles = a.op_nodes("tile")
    assert len(tiles) == 2 and b.op_nodes("tile") == []
    assert all(n.alarm and n.status == "only_a" for n in tiles)
    for n in tiles:  # each tile writes [1,8,4,4096,64] fp16 = 16 MiB, copied from a 4 MiB cache read
        assert n.output == "[1,8,4,4096,64] fp16" and n.replication_bytes == 16 * 2**20
        assert n.bytes_per_token == account(pair[0]).ops[n.ops[0]].total
    assert {n.title for n in a.nodes if n.kind == "state"} == {"k_cache_0", "v_cache_0"}
    # the tile's input edge comes from the KV cache (through expand_dims) and its output edge is replication
    tile_in = [e for e in a.edges if e.head == tiles[0].id]
    tile_out = [e for e in a.edges if e.tail == tiles[0].id]
    assert [e.kind for e in tile_in] == ["kv"] and [e.kind for e in tile_out] == ["replication"]
    assert tile_out[0].shape == "[1,8,4,4096,64]" and tile_out[0].nbytes == 16 * 2**20


@pytest.mark.parametrize("collapse", [True, False])
def test_every_op_of_the_layer_is_drawn_once_and_edges_point_down(pair, collapse):
    view = gv.layer_view(*pair, 0, collapse=collapse)
    for side, program in zip(view.sides, pair, strict=True):
        drawn = [i for n in side.nodes for i in n.ops]
        assert sorted(drawn) == _drawn(program, 0)
        if not collapse:
            assert all(len(n.ops) == 1 for n in side.nodes if n.kind in ("op", "chain"))
        depth = {n.id: n.depth for n in side.nodes}
        assert all(depth[e.tail] < depth[e.head] for e in side.edges)
        assert max(depth.values()) < view.rows
        # every dataflow edge between two drawn ops of different nodes is drawn
        node_of = {i: n.id for n in side.nodes for i in n.ops}
        expected = {(node_of[r.producer], node_of[op]) for op in node_of for r in program.ops[op].inputs
                    if r.producer in node_of and node_of[r.producer] != node_of[op]}
        assert {(e.tail, e.head) for e in side.edges if e.tail in node_of.values()} >= expected
    if collapse:  # the RMS norms collapse: pow → reduce_mean → add → rsqrt → mul → mul
        chains = [n for n in view.sides[0].nodes if n.kind == "chain"]
        assert any(n.title == "pow … mul (6 ops)" for n in chains)


def test_matched_ops_sit_on_the_same_row(pair, view0):
    a, b = view0.sides
    row_a = {i: n.depth for n in a.nodes for i in n.ops}
    row_b = {i: n.depth for n in b.nodes for i in n.ops}
    matched = [(r.a, r.b) for r in view0.diff.rows if not r.const and r.status in ("matched", "changed")]
    assert len(matched) == len(_drawn(pair[0], 0)) - 5  # all but expand_dims ×2, tile ×2 and one reshape
    assert all(row_a[x] == row_b[y] for x, y in matched if x in row_a and y in row_b)


def test_outside_and_single_program_views(pair):
    outside = gv.layer_view(*pair, None)
    assert outside.diff.identical and outside.title.startswith("outside the layers")
    assert sorted(i for n in outside.sides[0].nodes for i in n.ops) == _drawn(pair[0], None)
    assert any(n.title == "gather" for n in outside.sides[0].nodes)  # the embedding
    single = gv.layer_view(pair[1], None, 7, label_a="qfold")
    assert len(single.sides) == 1 and single.diff is None
    assert all(n.status is None for n in single.sides[0].nodes)
    assert sorted(i for n in single.sides[0].nodes for i in n.ops) == _drawn(pair[1], 7)
    with pytest.raises(QfoldError, match="no layer 30"):
        gv.layer_view(pair[1], None, 30, label_a="qfold")
    with pytest.raises(QfoldError, match="neither"):
        gv.layer_view(*pair, 30)
    assert gv.layer_choices(*pair) == [*range(30), None]
    assert [gv.parse_layer(t) for t in ("0", "29", "outside")] == [0, 29, None]
    for bad in ("-1", "x"):
        with pytest.raises(QfoldError, match="--layer"):
            gv.parse_layer(bad)


_NODE = re.compile(r'^\s*"([^"]+)" \[label=<', re.MULTILINE)
_EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)" \[xlabel', re.MULTILINE)


def test_dot_lists_exactly_the_view(view0):
    for i, side in enumerate(view0.sides):
        text = gv.side_dot(view0, i)
        assert sorted(_NODE.findall(text)) == sorted(n.id for n in side.nodes)
        assert sorted(_EDGE.findall(text)) == sorted((e.tail, e.head) for e in side.edges)
    both = gv.view_dot(view0)
    assert sorted(_NODE.findall(both)) == sorted(n.id for s in view0.sides for n in s.nodes)
    assert 'subgraph "cluster_A"' in both and 'subgraph "cluster_B"' in both


@needs_dot
def test_svg_sides_share_one_canvas_and_show_the_tiles(view0):
    svgs = gv.render_sides(view0)
    assert len({gv.svg_size_pt(s) for s in svgs}) == 1
    tiles = [len(re.findall(r'class="node op optype&#45;tile', s)) for s in svgs]
    assert tiles == [2, 0]
    page = gv.pair_html(view0, svgs)
    assert page.count("<svg") == 2 and "<script" not in page.lower()
    assert 'id="side-A"' in page and 'id="side-B"' in page


@needs_dot
def test_hostile_op_names_stay_text(pair):
    """Names come from any package: quotes, backslashes, DOT escapes and markup must stay text."""
    evil = ['x" ] ; "y', "a\\nb\\N", "<script>alert(1)</script>", "&amp;{}|<>"]
    program = pair[1]
    ops = list(program.ops)
    layer0 = _drawn(program, 0)
    for k, name in enumerate(evil):
        ops[layer0[k]] = replace(ops[layer0[k]], name=name)
    view = gv.layer_view(replace(program, ops=tuple(ops)), None, 0)
    svg = gv.render_svg(gv.view_dot(view))
    assert "<script" not in svg and "&lt;script&gt;" in svg


def test_graphviz_missing_is_a_clear_error(monkeypatch):
    from analyzer.report.graphview import render

    monkeypatch.setattr(render, "dot_binary", lambda: None)
    with pytest.raises(gv.GraphvizError, match="not installed"):
        gv.render_svg("digraph { a }")


def test_frames_behind_the_picture(pair, view0):
    nodes = gv.nodes_frame(view0, pair)
    acct = account(pair[0])
    a_ops = nodes[(nodes["side"] == "A") & nodes["kind"].isin(["op", "chain"])]
    assert int(a_ops["bytes_per_token"].sum()) == sum(acct.ops[i].total for i in _drawn(pair[0], 0))
    # replication: two tiles write 16 MiB each and the two attention matmuls read those 16 MiB again
    assert int(a_ops["replication_bytes"].sum()) == 4 * 16 * 2**20
    diff = structural_diff(*pair)
    table = gv.structdiff_frame(diff)
    assert list(table["layer"]) == [*map(str, range(30)), "outside"]
    assert set(table["type_deltas"][:30]) == {"−2 tile, −2 expand_dims, −4 const"}
    assert table["only_a"].sum() == sum(d.only_a for d in diff.layers)
    rows = gv.alignment_frame(view0.diff, *pair)
    assert Counter(rows["status"]) == Counter(r.status for r in view0.diff.rows)


@needs_dot
def test_report_section_embeds_both_graphs(pair):
    section = gv.report_html(*pair, "repeat_kv", "qfold", layer=0)
    assert section.count("<svg") == 2 and "layer 0 differs only in attention" in section


def test_a_picture_too_large_for_dot_is_refused_but_its_dot_is_written(pair, tmp_path, capsys):
    """A program whose op names give no layer numbers has everything "outside": ten layers' worth of nodes
    (563) would keep dot busy for minutes, so the SVG is refused and the DOT still written."""
    from analyzer.analysis.record import Analysis, write_analysis
    from analyzer.cli import main

    program = pair[0]
    merged = replace(program, ops=tuple(replace(op, layer=None) if (op.layer or 0) < 10 else op for op in program.ops))
    view = gv.layer_view(merged, None, None)
    assert len(view.sides[0].nodes) > gv.MAX_NODES_PER_SIDE
    with pytest.raises(gv.GraphvizError, match="download the DOT"):
        gv.render_sides(view)
    path = tmp_path / "merged.analysis.json"
    write_analysis(path, Analysis(merged))
    assert main(["graph", str(path), "--layer", "outside", "--out", str(tmp_path / "x.svg")]) == 1
    assert "download the DOT instead" in capsys.readouterr().err
    assert main(["graph", str(path), "--layer", "outside", "--out", str(tmp_path / "x.dot")]) == 0
    assert len(_NODE.findall((tmp_path / "x.dot").read_text())) == len(view.sides[0].nodes)


@needs_dot
def test_html_report_embeds_layer0_of_a_and_b():
    from analyzer.report.report import build_report

    docs = [load_analysis(SHIPPED_DIR / f"{stem}.analysis.json") for stem in (REPEAT_KV, QFOLD)]
    page = build_report(*docs, label_a="repeat_kv", label_b="qfold")
    section = page[page.index("<h2>Graph of layer 0</h2>"):]
    side_a, side_b = section.split('id="side-B"')[0], section.split('id="side-B"')[1].split("</svg>")[0]
    assert side_a.count('class="node op optype&#45;tile') == 2 and "optype&#45;tile" not in side_b
