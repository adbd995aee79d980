"""``qfold explore`` (issue 38) without a browser: the files are Model Explorer's own format (round-tripped through
its ``graph_builder`` / ``node_data_builder`` dataclasses), a pair's ids and mapping follow the structural diff, the
CLI contract (files, printed command, busy port, bad input, Model Explorer missing), a Core AI asset, a
multi-function build (``--function``), a flexible package from torch + ``ct.convert`` (``--shape``), and hostile
op names as data in every file and in the URL. tests/test_explore_browser.py serves them in headless Chromium."""

from __future__ import annotations

import dataclasses
import json
import socket
import types
import typing
from dataclasses import replace
from pathlib import Path
from urllib.parse import unquote

import pytest
from model_explorer import graph_builder as gb
from model_explorer import node_data_builder as ndb

from analyzer import cli
from analyzer.analysis.accounting import account
from analyzer.analysis.record import Analysis, load_analyses, load_analysis, write_analysis
from analyzer.compare.structdiff import structural_diff
from analyzer.report import explorer as mx
from analyzer.report.explorer import explorer_server

pytestmark = pytest.mark.conversion
# Op names and types a package may hold (the Graph tab's and the dashboard's hostile names).
HOSTILE = ['x" ] ; "y', "a\\nb\\N", "<script>alert(1)</script>", "&amp;{}|<>", "<img src=x onerror=alert(1)>",
           "[Session expired: sign in again](http://198.51.100.7/phish)", "layers.0/self_attn/../../evil"]


# ----------------------------------------------------------------------------------------- Model Explorer's types
def _hints(cls) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls, {**vars(gb), **vars(ndb)})


def build(cls, data: dict):
    """A Model Explorer dataclass from our JSON, strictly: a field it does not have fails, a missing required one
    fails (its constructor)."""
    assert isinstance(data, dict), (cls.__name__, data)
    hints = _hints(cls)
    unknown = set(data) - set(hints)
    assert not unknown, f"{cls.__name__} has no field(s) {sorted(unknown)}"
    return cls(**{k: _value(hints[k], v) for k, v in data.items()})


def _value(tp, v):
    if dataclasses.is_dataclass(tp):
        return build(tp, v)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is list:
        assert isinstance(v, list)
        return [_value(args[0], x) for x in v]
    if origin is dict:
        assert isinstance(v, dict)
        return {k: _value(args[1], x) for k, x in v.items()}
    if origin in (typing.Union, types.UnionType):
        klass = [a for a in args if dataclasses.is_dataclass(a)]
        return build(klass[0], v) if klass and isinstance(v, dict) else v
    return v


def same(ours, obj) -> None:
    """``obj`` (built from ``ours``) holds exactly what ``ours`` says, and every field ``ours`` leaves out is at
    Model Explorer's default."""
    if dataclasses.is_dataclass(obj):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name in ours:
                same(ours[f.name], value)
            else:
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                assert value == default, (type(obj).__name__, f.name)
    elif isinstance(obj, list):
        assert len(ours) == len(obj)
        for x, y in zip(ours, obj, strict=True):
            same(x, y)
    elif isinstance(obj, dict):
        assert set(ours) == set(obj)
        for k in obj:
            same(ours[k], obj[k])
    else:
        assert ours == obj


def check_model_explorer_format(bundle: mx.Bundle) -> None:
    for name, data in bundle.files.items():
        doc = json.loads(data)
        if name.endswith(".graph.json"):
            same(doc, build(gb.GraphCollection, doc))
        elif name == mx.MAPPING_FILE:  # the web app's SyncNavigationData: {mapping: {left: right}, ...}
            assert set(doc) == {"mapping", "disableMappingFallback"}
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in doc["mapping"].items())
        else:  # a ModelNodeData document: graph id → GraphNodeData
            model = ndb.ModelNodeData(graphsData={k: build(ndb.GraphNodeData, v) for k, v in doc.items()})
            assert json.loads(model.to_json_string()).keys() == doc.keys()
            same(doc, model.graphsData)


# ------------------------------------------------------------------------------------------------ the pair
@pytest.fixture(scope="module")
def pair(tiny_builds) -> tuple[Analysis, Analysis]:
    return load_analysis(tiny_builds["repeat_kv"]), load_analysis(tiny_builds["qfold"])


@pytest.fixture(scope="module")
def bundle(pair) -> mx.Bundle:
    a, b = pair
    return mx.build_bundle(mx.ExploreSide("repeat_kv", (a,)), mx.ExploreSide("qfold", (b,)))


def _graph(bundle: mx.Bundle, side: str) -> dict:
    return json.loads(bundle.files[f"{side}.graph.json"])["graphs"][0]


def test_files_are_model_explorers_own_format(bundle):
    check_model_explorer_format(bundle)


def test_pair_files_ids_and_mapping_follow_the_structural_diff(pair, bundle):
    a, b = pair
    overlays = ("bytes_per_token", "weights_bytes", "kv_read_bytes", "kv_write_bytes", "activations_bytes",
                "replication_bytes", "flops", "diff")
    assert set(bundle.files) == {"a.graph.json", "b.graph.json", mx.MAPPING_FILE,
                                 *(f"{s}.{o}.json" for s in "ab" for o in overlays)}
    ga, gb_ = _graph(bundle, "a"), _graph(bundle, "b")
    assert (ga["id"], gb_["id"]) == ("A:main", "B:main")
    assert len(ga["nodes"]) == a.program.total_ops + 2 and len(gb_["nodes"]) == b.program.total_ops + 2
    mapping = json.loads(bundle.files[mx.MAPPING_FILE])["mapping"]
    diff = structural_diff(a.program, b.program)
    aligned = [r for d in diff.layers for r in d.rows if r.a is not None and r.b is not None]
    assert mapping == {f"a{r.a}.b{r.b}": f"a{r.a}.b{r.b}" for r in aligned} and bundle.mapped == len(aligned)
    ids_a, ids_b = {n["id"] for n in ga["nodes"]}, {n["id"] for n in gb_["nodes"]}
    assert set(mapping) <= ids_a & ids_b
    # the copies: only in A, red, under their layer's attention, classified, with their replication bytes
    acct = account(a.program)
    tiles = [n for n in ga["nodes"] if n["label"] == "tile"]
    assert len(tiles) == 4 and not [n for n in gb_["nodes"] if n["label"] == "tile"]
    replication = json.loads(bundle.files["a.replication_bytes.json"])["A:main"]["results"]
    for n in tiles:
        index = int(n["id"][1:])
        attrs = {kv["key"]: kv["value"] for kv in n["attrs"]}
        assert n["namespace"] in ("layers.0/self_attn", "layers.1/self_attn")
        assert attrs["diff"] == "only in A" and attrs["replication"].startswith("KV replication: 8 KV heads")
        assert n["style"]["backgroundColor"] == "#e45756"
        assert int(attrs["replication_bytes"]) == acct.ops[index].replication == replication[n["id"]]["value"] > 0
        assert n["outputsMetadata"][0]["attrs"][0] == {"key": "tensor_name", "value": a.program.ops[index].name}
    assert sum(v["value"] for v in replication.values()) == acct.per_token().replication
    # 2 layers, collapsed groups: every op is under a layer or outside
    spaces = {n["namespace"].split("/")[0] for n in ga["nodes"]}
    assert spaces == {"", "layers.0", "layers.1", "outside"}
    assert {"layers.0/self_attn", "layers.0/mlp"} <= {n["namespace"] for n in ga["nodes"]}
    graph_attrs = ga["groupNodeAttributes"][""]
    assert int(graph_attrs["replication_bytes"]) == acct.per_token().replication
    status = json.loads(bundle.files["b.diff.json"])["B:main"]["results"]
    assert {v["value"] for v in status.values()} <= {"matched", "same op, other shapes", "only in B"}


def test_the_url_opens_both_panes_synced(bundle, tmp_path):
    url = bundle.url(tmp_path, 8123)
    assert url.startswith("http://127.0.0.1:8123/?data=")
    data = json.loads(unquote(url.partition("?data=")[2]))
    assert [m["url"] for m in data["models"]] == [str(tmp_path / "a.graph.json"), str(tmp_path / "b.graph.json")]
    assert data["sync"] == {"mode": "match_node_id"}
    panes = data["uiState"]["paneStates"]
    assert [(p["selectedGraphId"], p["selectedCollectionLabel"]) for p in panes] == [
        ("A:main", "A: repeat_kv"), ("B:main", "B: qfold")]
    assert len(data["nodeData"]) == len(data["nodeDataTargets"]) == 16
    assert data["nodeData"][7].endswith("a.replication_bytes.json")  # shown: the last one loaded per side


# ------------------------------------------------------------------------------------------------ the CLI
def _run(argv, capsys) -> tuple[int, list[str], list[str]]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_out_writes_the_files_and_prints_what_opens_them(tiny_builds, tmp_path, capsys):
    out = tmp_path / "mx"
    code, lines, _ = _run(["explore", str(tiny_builds["repeat_kv"]), str(tiny_builds["qfold"]), "--out", str(out),
                           "--port", "8090"], capsys)
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == sorted([*(f"{s}.graph.json" for s in "ab"), "mapping.json",
                                                            *(f"{s}.{o}.json" for s in "ab" for o in (
                                                                "bytes_per_token", "weights_bytes", "kv_read_bytes",
                                                                "kv_write_bytes", "activations_bytes",
                                                                "replication_bytes", "flops", "diff"))])
    command = next(line for line in lines if line.startswith("open them: "))
    assert "-m model_explorer" in command and "--port=8090" in command and "--node_data_paths=" in command
    assert lines[-1].startswith("then, for A and B side by side: http://127.0.0.1:8090/?data=")
    assert any(line.startswith("structural diff (main): layers 0–1 differ only in attention") for line in lines)


def test_a_busy_port_is_exit_1_one_line(tiny_builds, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code, lines, err = _run(["explore", str(tiny_builds["qfold"]), "--port", str(port), "--no-browser"], capsys)
    assert code == 1 and lines == []
    assert err == [f"error: port {port} on 127.0.0.1 is busy (in use); pick another with --port"]


def test_bad_input_is_exit_1_one_line_naming_the_file(pair, tmp_path, capsys):
    missing = tmp_path / "nope.mlpackage"
    code, _, err = _run(["explore", str(missing), "--out", str(tmp_path / "o")], capsys)
    assert code == 1 and len(err) == 1 and str(missing) in err[0]
    a = pair[0]
    for name, ops, why in (("empty", (), "has no ops"), ("dangling", None, "which makes no tensor of that name")):
        if ops is None:  # an op reading a tensor its producer does not make
            ops = list(a.program.ops)
            k = next(i for i, op in enumerate(ops) if any(r.producer is not None for r in op.inputs))
            ref = next(r for r in ops[k].inputs if r.producer is not None)
            bad = replace(ref, tensor=replace(ref.tensor, name="not_made"))
            ops[k] = replace(ops[k], inputs=tuple(bad if r is ref else r for r in ops[k].inputs))
        path = tmp_path / f"{name}.analysis.json"
        write_analysis(path, replace(a, program=replace(a.program, ops=tuple(ops))))
        code, _, err = _run(["explore", str(path), "--out", str(tmp_path / name)], capsys)
        assert code == 1 and len(err) == 1, err
        assert err[0].startswith(f"error: {path}: cannot make a graph: ") and why in err[0]
        assert not (tmp_path / name).exists()  # nothing half-written


def test_without_model_explorer_the_files_are_written_and_the_install_line_printed(tiny_builds, monkeypatch,
                                                                                   capsys):
    monkeypatch.setattr(mx, "explorer_installed", lambda: False)
    code, lines, err = _run(["explore", str(tiny_builds["qfold"])], capsys)
    assert code == 1 and 'pip install "ai-edge-model-explorer==0.1.34"' in err[-1]
    assert all(line.startswith("qfold explore: ") for line in err[:-1])  # progress lines, then the one error
    assert f"Model Explorer is not installed: {mx.INSTALL_LINE}" in lines
    folder = Path(next(line for line in lines if line.startswith("wrote ")).rpartition(" to ")[2])
    try:
        assert (folder / "a.graph.json").is_file() and (folder / "a.replication_bytes.json").is_file()
    finally:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()


def test_is_local():
    assert all(map(explorer_server.is_local, ("localhost", "127.0.0.1:8501", "[::1]:8501", "LOCALHOST:1")))
    assert not any(map(explorer_server.is_local, ("", None, "0.0.0.0", "example.com:8501", "10.0.0.2")))


# ------------------------------------------------------------------------------------------------ other programs
def test_multi_function_build_one_graph_each_or_the_one_asked_for(tiny_phase_builds, tmp_path, capsys):
    a = tiny_phase_builds["repeat_kv"]
    names = [x.function for x in load_analyses(a)]
    assert len(names) == 2
    code, _, _ = _run(["explore", str(a), str(tiny_phase_builds["qfold"]), "--out", str(tmp_path / "all")], capsys)
    assert code == 0
    doc = json.loads((tmp_path / "all" / "a.graph.json").read_text())
    assert [g["id"] for g in doc["graphs"]] == [f"A:{n}" for n in names]
    mapping = json.loads((tmp_path / "all" / "mapping.json").read_text())["mapping"]
    b_ids = {n["id"] for g in json.loads((tmp_path / "all" / "b.graph.json").read_text())["graphs"]
             for n in g["nodes"]}
    assert mapping and set(mapping) <= b_ids
    code, _, _ = _run(["explore", str(a), "--function", names[1], "--out", str(tmp_path / "one")], capsys)
    assert code == 0
    doc = json.loads((tmp_path / "one" / "a.graph.json").read_text())
    assert [g["id"] for g in doc["graphs"]] == [f"A:{names[1]}"]
    replication = json.loads((tmp_path / "one" / "a.replication_bytes.json").read_text())
    assert list(replication) == [f"A:{names[1]}"]


def test_a_flexible_package_is_drawn_at_the_shape_given(tmp_path, capsys):
    """Apple's Llama 3.1 recipe style (tests/shipped_styles.py): flexible ``inputIds [1, 1…Q]`` and ``causalMask``,
    KV copies read by attention; drawn at a query length of 2 over a visible context of 8."""
    from tests.shipped_styles import llama_recipe

    package = llama_recipe(tmp_path / "flex.mlpackage")
    shapes = ["inputIds=1,2", "causalMask=1,1,2,8"]
    code, lines, _ = _run(["explore", package, *(x for s in shapes for x in ("--shape", s)), "--out",
                           str(tmp_path / "mx")], capsys)
    assert code == 0
    assert "A: flexible input analysed at inputIds [1,2] (given (--shape))" in lines
    doc = json.loads((tmp_path / "mx" / "a.graph.json").read_text())
    assert doc["label"] == "A: flex @ inputIds[1,2] causalMask[1,1,2,8]"
    graph = doc["graphs"][0]
    assumed = graph["groupNodeAttributes"][""]["assumed_shapes"]
    assert assumed == "inputIds [1,2] (given (--shape)); causalMask [1,1,2,8] (given (--shape))"
    copies = [n for n in graph["nodes"] if any(kv["key"] == "replication" for kv in n["attrs"])]
    kv = [n for n in copies if dict((x["key"], x["value"]) for x in n["attrs"])["replication"].startswith("KV ")]
    assert kv, "the recipe's K and V copies"
    for n in kv:  # sized at the given shapes: the visible context of 8, counted
        attrs = {x["key"]: x["value"] for x in n["attrs"]}
        assert attrs["assumed_shapes"] == assumed and int(attrs["replication_bytes"]) > 0
        shape = next(x["value"] for x in n["outputsMetadata"][0]["attrs"] if x["key"] == "shape")
        assert "?" not in shape and ",8," in shape, shape
    code, _, err = _run(["explore", package, "--shape", "nope=1,2", "--out", str(tmp_path / "x")], capsys)
    assert code == 1 and len(err) == 1 and "nope" in err[0]


def test_a_core_ai_asset(tmp_path, capsys):
    pytest.importorskip("coreai_torch")
    from tests.coreai_assets import foreign_asset

    asset = foreign_asset(tmp_path / "llama.aimodel")
    code, _, _ = _run(["explore", str(asset), "--out", str(tmp_path / "mx")], capsys)
    assert code == 0
    files = {p.name: json.loads(p.read_text()) for p in (tmp_path / "mx").iterdir()}
    graph = files["a.graph.json"]["graphs"][0]
    assert graph["groupNodeAttributes"][""]["backend"] == "coreai"
    copies = [n for n in graph["nodes"] if any(kv["key"] == "replication" for kv in n["attrs"])]
    assert copies and all(n["label"].startswith("coreai.") for n in copies)
    layers = {n["namespace"].split("/")[0] for n in graph["nodes"]}
    assert {"layers.0", "layers.1"} <= layers
    check_model_explorer_format(mx.Bundle({k: json.dumps(v).encode() for k, v in files.items()}, ("A: llama",),
                                          (("A:main",),), ((),)))


# ------------------------------------------------------------------------------------------------ hostile names
def hostile_pair(pair) -> tuple[Analysis, Analysis]:
    """The tiny pair with hostile output names on ops of layer 0 (a tile among them, its readers renamed with it)
    and a hostile op type."""
    out = []
    for analysis in pair:
        ops = list(analysis.program.ops)
        targets = [op.index for op in ops if op.layer == 0 and op.kind != "const"][: len(HOSTILE) - 1]
        targets += [op.index for op in ops if op.kind == "tile"][:1]  # B (Q-fold) has none
        renamed = {ops[k].outputs[0].name: HOSTILE[i] for i, k in enumerate(targets)}
        for k, op in enumerate(ops):
            outs = tuple(replace(t, name=renamed.get(t.name, t.name)) for t in op.outputs)
            refs = tuple(replace(r, tensor=replace(r.tensor, name=renamed.get(r.tensor.name, r.tensor.name)))
                         for r in op.inputs)
            ops[k] = replace(op, name=outs[0].name if outs else op.name, outputs=outs, inputs=refs)
        ops[targets[0]] = replace(ops[targets[0]], type=HOSTILE[4])
        out.append(replace(analysis, program=replace(analysis.program, ops=tuple(ops))))
    return out[0], out[1]


def test_hostile_names_are_data_in_every_file_and_the_url(pair, tmp_path):
    a, b = hostile_pair(pair)
    label = HOSTILE[5] + HOSTILE[4]
    bundle = mx.build_bundle(mx.ExploreSide(label, (a,)), mx.ExploreSide(HOSTILE[0], (b,)))
    check_model_explorer_format(bundle)
    strings: list[str] = []

    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                assert k not in HOSTILE, k  # never a key: names are values
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
        elif isinstance(v, str):
            strings.append(v)

    for data in bundle.files.values():
        walk(json.loads(data))
    for evil in HOSTILE[:5]:
        assert evil in strings  # kept exactly, as text
    graph = _graph(bundle, "a")
    # names never reach the namespace (a path in Model Explorer's layer tree)
    assert not [n for n in graph["nodes"] if any(h in n["namespace"] for h in HOSTILE)]
    assert graph["nodes"][1]["namespace"].split("/")[0] in ("layers.0", "outside")
    url = bundle.url(tmp_path, 8080)
    assert not set(url.partition("?")[2]) & set("<>\"' []()\\"), url
    assert json.loads(unquote(url.partition("?data=")[2]))["uiState"]["paneStates"][0]["selectedCollectionLabel"] \
        == f"A: {label}"


def test_a_placement_plan_puts_device_and_cost_on_each_op(pair, tiny_builds, tmp_path, capsys):
    from tests.placement_plans import plan_bytes, slice_update_on_cpu

    plan = tmp_path / "a.plan.json"
    plan.write_bytes(plan_bytes(pair[0], slice_update_on_cpu))
    code, lines, _ = _run(["explore", str(tiny_builds["repeat_kv"]), str(tiny_builds["qfold"]), "--plan",
                           f"A={plan}", "--out", str(tmp_path / "mx")], capsys)
    assert code == 0 and any(line.startswith(f"A: plan {plan.name}: ") for line in lines)
    device = json.loads((tmp_path / "mx" / "a.device.json").read_text())["A:main"]
    assert not (tmp_path / "mx" / "b.device.json").exists()
    graph = json.loads((tmp_path / "mx" / "a.graph.json").read_text())["graphs"][0]
    types_by_id = {n["id"]: n["label"] for n in graph["nodes"]}
    on_cpu = {types_by_id[k] for k, v in device["results"].items() if v["value"] == "CPU"}
    assert on_cpu == {"slice_update"} and device["showExpandedSummaryOnGroupNode"] is True
    assert {v["bgColor"] for v in device["results"].values() if v["value"] == "CPU"} == {"#F58518"}
    update = next(n for n in graph["nodes"] if n["label"] == "slice_update")
    attrs = {kv["key"]: kv["value"] for kv in update["attrs"]}
    assert attrs["device"] == "CPU" and float(attrs["cost_weight"]) > 0
    code, _, err = _run(["explore", str(tiny_builds["qfold"]), "--plan", f"B={plan}", "--out", str(tmp_path / "x")],
                        capsys)
    assert code == 1 and err == ["error: --plan B=…: give TARGET_B too"]
