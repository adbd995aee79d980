"""The typed analysis record: schema versions (v1 migrated, unknown refused), a lossless v2 round trip, and
malformed files refused with one line naming the file and the field, never a traceback.

``tests/data/v1-tiny-repeat_kv-top8.analysis.json`` is a schema-1 ``analysis.json`` as qfold 0.1.0 wrote it for
a 2-layer structure build of the default preset (repeat_kv, ctx 256, top8), kept to test the migration.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.analysis.record import SCHEMA_VERSION, analysis_from_json, read_analysis_file
from analyzer.compare.diff import figure_differences
from analyzer.errors import AnalysisFileError
from analyzer.fsio import write_json_atomic

REPO = Path(__file__).resolve().parent.parent
V1 = REPO / "tests" / "data" / "v1-tiny-repeat_kv-top8.analysis.json"


@pytest.fixture(scope="module")
def v1_doc() -> dict:
    return json.loads(V1.read_text())


def test_v1_fixture_is_small_and_of_the_previous_schema(v1_doc):
    assert V1.stat().st_size < 200_000
    assert v1_doc["schema_version"] == 1 == SCHEMA_VERSION - 2
    assert all(len(op) == 9 for op in v1_doc["program"]["ops"])  # no parent field yet


def test_v1_is_migrated_to_the_figures_it_was_stored_with(v1_doc):
    a = read_analysis_file(V1)
    assert a.migrated_from == 1 and a.file == str(V1)
    summary = a.summary.to_json()
    added = ("op_type", "reason", "reps", "reps_from")  # issue #37: what each copy is and why, derived again
    assert {**summary, "tiles": [{k: v for k, v in t.items() if k not in added} for t in summary["tiles"]]} == \
        {**v1_doc["summary"], "unsized_copies": 0}  # unsized_copies: a count schema 3 added
    assert [(t["op_type"], t["reps_from"]) for t in summary["tiles"]] == [("tile", "constant")] * 4
    assert all(t["reason"].startswith("copies whole K/V heads for attention") for t in summary["tiles"])
    assert a.sizing.sized and a.program.sizing_error is None
    assert a.bytes_per_token.to_json() == v1_doc["bytes"]["bytes_per_token"]
    assert [r.to_json() for r in a.bytes_by_layer] == v1_doc["bytes"]["bytes_by_layer"]
    # every figure stored then is read back the same; rows now also say how a weight is stored (granularity,
    # stored dtypes: issue 41), which v1 did not record
    got, stored = a.compression.to_json(), v1_doc["compression_report"]
    assert {k: got[k] for k in stored} == {**stored, "weights": got["weights"]}
    assert [{k: w[k] for k in old} for w, old in zip(got["weights"], stored["weights"], strict=True)] == \
        stored["weights"]
    assert {w.get("granularity") for w in got["weights"] if w["op_type"] != "const"} <= {
        "per-channel", *(f"per-grouped-channel {w['group_channels']}" for w in stored["weights"]
                         if w.get("group_channels"))}
    assert a.compression.precision_text("attn") == "int8 in layers 0-1"  # top8 on 2 layers: all promoted
    b = a.build
    assert b is not None and b.key == v1_doc["key"] and b.spec.compression == v1_doc["spec"]["compression"]
    assert b.geometry.num_layers == 2 and b.timings_s == v1_doc["timings"] and b.untied_embeddings
    assert b.equivalence is not None and {p.dtype for p in b.equivalence.pairs} == {"fp16", "fp32"}


def test_v1_op_facts_are_derived_again_by_the_current_walker(v1_doc, tmp_path):
    """Layers and tile kinds stored by the old walker are not trusted: wipe them, and the migration gives
    the same facts back."""
    doc = copy.deepcopy(v1_doc)
    for op in doc["program"]["ops"]:
        op[2], op[3] = 99, "stale"
        if op[0] == "tile":
            op[7] = "other"
    (tmp_path / "stale.json").write_text(json.dumps(doc))
    migrated = read_analysis_file(tmp_path / "stale.json")
    assert [t.kind for t in migrated.summary.tiles] == ["kv_replication"] * 4
    assert sorted({op.layer for op in migrated.program.ops} - {None}) == [0, 1]
    assert figure_differences(read_analysis_file(V1), migrated) == ()


def test_v2_round_trip_is_lossless_and_keeps_unknown_fields(v1_doc, tmp_path):
    a = read_analysis_file(V1)
    doc = a.to_json()
    assert doc["schema_version"] == SCHEMA_VERSION and list(doc)[:3] == ["schema_version", "key", "created"]
    doc["build_mode"] = {"kind": "fast"}  # a field a newer qfold (or another branch) writes
    doc["spec"]["analysis_only"] = True
    write_json_atomic(tmp_path / "v2.json", doc)
    b = read_analysis_file(tmp_path / "v2.json")
    assert b.migrated_from is None and b.program == a.program
    assert b.build.extra == {"build_mode": {"kind": "fast"}} and b.build.spec.extra == {"analysis_only": True}
    expected = json.loads(json.dumps(a.to_json()))
    expected["spec"]["analysis_only"], expected["build_mode"] = True, {"kind": "fast"}
    assert json.loads(json.dumps(b.to_json())) == expected
    assert figure_differences(a, b) == ()


def test_a_package_analysis_has_no_build(v1_doc):
    doc = {k: v for k, v in v1_doc.items() if k in ("schema_version", "program")}
    a = analysis_from_json(doc, "package.json")
    assert a.build is None and a.variant is None
    assert list(a.to_json()) == ["schema_version", "summary", "bytes", "sizing", "program"]


def _mutate(doc: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(doc)
    target = out
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


_DELETE = object()


@pytest.mark.parametrize(("path", "value", "fragment"), [
    (("schema_version",), 4, "schema_version: schema version 4 (written by a newer qfold)"),
    (("schema_version",), 0, "schema_version: schema version 0; this qfold reads versions 1, 2, 3"),
    (("schema_version",), "2", "schema_version: expected an integer, got a string"),
    (("schema_version",), _DELETE, "no schema_version"),
    (("program",), _DELETE, "field program: missing"),
    (("program", "ops", 3), ["const", "x"], "field program.ops[3]: expected 9 items, got 2"),
    (("program", "ops", 5, 4, 0, 1, 1), "big", "field program.ops[5][4][0][1][1]: expected a list, got a string"),
    (("program", "ops", 7, 2), "seven", "field program.ops[7][2]: expected an integer"),
    (("program", "ops", 9, 4, 0, 2), 400, "reads op 400, which does not come before it"),
    (("program", "outputs", 0, 3), 1, "field program.outputs[0][3]: 1 bytes, but"),
    (("spec", "ctx"), -1, "field spec.ctx: expected a count ≥ 0, got -1"),
    (("spec", "source", "kind"), "url", "field spec.source.kind: expected one of preset, config, folder"),
    (("timings", "convert_s"), True, "field timings.convert_s: expected a finite number, got a boolean"),
    (("equivalence", "pairs", 0, "bit_identical"), "yes", "field equivalence.pairs[0].bit_identical"),
    (("geometry", "num_kv_heads"), 5, "field geometry.num_kv_heads: 32 query heads are not a multiple of 5"),
    (("peak_rss_bytes",), _DELETE, "field peak_rss_bytes: missing"),
])
def test_malformed_fields_are_named(v1_doc, tmp_path, path, value, fragment):
    f = tmp_path / "bad.analysis.json"
    f.write_text(json.dumps(_mutate(v1_doc, path, value)))
    with pytest.raises(AnalysisFileError) as e:
        read_analysis_file(f)
    assert str(f) in str(e.value) and fragment in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("content", "fragment"), [
    (b"\xff\xfe{}", "not UTF-8 text (byte 0)"),
    (b"[" * 100_000 + b"]" * 100_000, "nested deeper than 64 levels"),
    (b'{"schema_version": 2, "x": NaN}', "field x is NaN; only finite numbers are accepted"),
    (b'{"schema_version": 2,', "not valid JSON"),
    (b"[1, 2]", "expected an object, got a list"),
    (b"", "not valid JSON"),
])
def test_unreadable_files_are_refused_in_one_line(tmp_path, content, fragment):
    f = tmp_path / "bad.analysis.json"
    f.write_bytes(content)
    with pytest.raises(AnalysisFileError) as e:
        read_analysis_file(f)
    assert str(e.value).startswith(f"{f}: ") and fragment in str(e.value), str(e.value)


def test_cli_refuses_a_newer_schema_in_one_line(v1_doc, tmp_path):
    f = tmp_path / "future.analysis.json"
    f.write_text(json.dumps({**v1_doc, "schema_version": 9}))
    out = subprocess.run([sys.executable, "-m", "analyzer", "inspect", str(f), "--json"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert out.returncode == 1 and out.stdout == ""
    (line,) = out.stderr.strip().splitlines()
    assert "schema version 9" in line and str(f) in line and "Traceback" not in out.stderr


def test_writing_is_strict_json(tmp_path):
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_json_atomic(tmp_path / "x.json", {"timings": {"convert_s": float("nan")}})
    assert not (tmp_path / "x.json").exists()


_JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats(allow_nan=False)
                            | st.text(max_size=5), lambda inner: st.lists(inner, max_size=3)
                            | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_corruption_loads_or_is_refused_cleanly(v1_doc, data):
    """Replace one value anywhere in the document: the result loads, or fails as AnalysisFileError naming the
    file — never another exception."""
    path: list = []
    node = v1_doc
    while isinstance(node, dict | list) and node and data.draw(st.integers(0, 4), label="depth") > 0:
        key = data.draw(st.sampled_from(sorted(node) if isinstance(node, dict) else range(len(node))))
        path.append(key)
        node = node[key]
    if not path:
        return
    doc = _mutate(v1_doc, tuple(path), data.draw(_JSON_VALUES, label="value"))
    try:
        a = analysis_from_json(doc, "corrupt.json")
        a.summary, a.account, a.compression  # noqa: B018 (derived figures must compute too)
    except AnalysisFileError as e:
        assert str(e).startswith("corrupt.json: ")
