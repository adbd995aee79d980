"""``python -m analyzer graph`` on the session's tiny builds (real conversions): the DOT's nodes and edges are the
layer's ops and their dataflow, the SVG shows the tiles, and bad requests fail in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from analyzer.analysis.record import load_analysis
from analyzer.cli import main
from analyzer.compare.structdiff import home_layers, is_const_like, structural_diff
from analyzer.ir.coreml.mil_reader import MilProgram, find_package, read_program
from analyzer.report import graphview as gv
from analyzer.report.catalog import SHIPPED_DIR

pytestmark = pytest.mark.conversion

_NODE = re.compile(r'^\s*"([^"]+)" \[label=<', re.MULTILINE)
_EDGE = re.compile(r'^\s*"([^"]+)" -> "([^"]+)" \[xlabel', re.MULTILINE)
_OP_ID = re.compile(r"^([AB])(\d+)$")


def _layer_ops(program: MilProgram, layer: int | None) -> set[int]:
    homes = home_layers(program)
    return {op.index for op in program.ops if homes[op.index] == layer and not is_const_like(op)}


def _dataflow(program: MilProgram, ops: set[int]) -> set[tuple[int, int]]:
    return {(r.producer, i) for i in ops for r in program.ops[i].inputs if r.producer in ops}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("layer", ["0", "1", "outside"])
def test_dot_nodes_and_edges_are_the_layers_ops(tiny_builds, tmp_path, capsys, layer):
    build = tiny_builds["repeat_kv"]
    program = read_program(build)
    out = tmp_path / "g.dot"
    code, stdout, _ = _run(capsys, "graph", str(build), "--layer", layer, "--out", str(out), "--no-collapse")
    assert code == 0 and stdout.strip().splitlines()[-1] == str(out)
    text = out.read_text()
    ops = _layer_ops(program, gv.parse_layer(layer))
    nodes = _NODE.findall(text)
    op_nodes = {int(m[2]) for m in map(_OP_ID.match, nodes) if m}
    assert op_nodes == ops  # one node per op, every op of the layer
    edges = {(int(_OP_ID.match(t)[2]), int(_OP_ID.match(h)[2])) for t, h in _EDGE.findall(text)
             if _OP_ID.match(t) and _OP_ID.match(h)}
    assert edges == _dataflow(program, ops)  # one edge per tensor between two of the layer's ops
    others = [n for n in nodes if not _OP_ID.match(n)]  # tensors entering / leaving the layer, KV states
    assert all(re.match(r"^A(in|out|state|written):", n) for n in others)
    if layer != "outside":  # repeat_kv: K and V each tiled once per layer
        assert sum(1 for i in op_nodes if program.ops[i].type == "tile") == 2


def test_ab_svg_shows_the_tiles_on_one_side(tiny_builds, tmp_path, capsys):
    if gv.dot_binary() is None:
        pytest.skip("Graphviz 'dot' is not installed")
    a, b = tiny_builds["repeat_kv"], tiny_builds["qfold"]
    out = tmp_path / "ab.svg"
    code, stdout, _ = _run(capsys, "graph", str(a), str(find_package(b)), "--out", str(out))
    assert code == 0
    assert "layer 0 differs only in attention: −2 tile, −2 expand_dims, −4 const" in stdout
    svg = out.read_text()
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    tile_ids = re.findall(r'<g id="([AB][^"]*)" class="node op optype&#45;tile', svg)
    assert len(tile_ids) == 2 and all(i.startswith("A") for i in tile_ids)


def test_tiny_pair_structural_diff(tiny_builds):
    pa, pb = read_program(tiny_builds["repeat_kv"]), read_program(tiny_builds["qfold"])
    diff = structural_diff(pa, pb)
    assert diff.verdict == ("layers 0–1 differ only in attention: −2 tile, −2 expand_dims, −4 const each; "
                            "outside the layers: identical")
    assert pb.total_ops - pa.total_ops == -16
    # against the 30-layer shipped Q-fold: layers 2–29 exist on one side only
    shipped = load_analysis(SHIPPED_DIR / "exaone-4.0-1.2b-qfold-state-ctx4096.analysis.json").program
    wide = structural_diff(pa, shipped)
    assert [d.layer for d in wide.layers] == [*range(30), None]
    assert wide.layer(5).verdict == f"layer 5 only in B: {wide.layer(5).ops_b:,} ops"
    assert wide.layer(5).ops_a == 0 and wide.layer(5).only_b == wide.layer(5).ops_b
    assert "layers 2–28 only in B: 142 ops each; layer 29 only in B: 152 ops" in wide.verdict


def test_bad_requests_fail_in_one_line(tiny_builds, tmp_path, capsys, monkeypatch):
    build = str(tiny_builds["repeat_kv"])
    cases = [
        (["--layer", "7", "--out", str(tmp_path / "x.dot")], "has no layer 7"),
        (["--layer", "first", "--out", str(tmp_path / "x.dot")], "a layer number or 'outside'"),
        (["--out", str(tmp_path / "x.png")], "name a .svg or a .dot file"),
        (["--out", str(tmp_path / "missing" / "x.dot")], "does not exist"),
    ]
    for extra, message in cases:
        code, _, err = _run(capsys, "graph", build, *extra)
        assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err
    code, _, err = _run(capsys, "graph", str(tmp_path / "nothing"), "--out", str(tmp_path / "x.dot"))
    assert code == 1 and "not an .mlpackage" in err
    monkeypatch.setenv("PATH", str(tmp_path))  # no dot on PATH
    code, _, err = _run(capsys, "graph", build, "--out", str(tmp_path / "x.svg"))
    assert code == 1 and "not installed" in err and "x.dot instead" in err
    assert not Path(tmp_path / "x.svg").exists()
