"""anemll-profile's per-op tables joined per op on a real 2-layer conversion: a report synthesised with the tool's own
format strings (tests/placement_plans.py, from anemll_profile.m) from the tiny Q-fold build's op names. Every Top-N
row and every fallback row joins, an op two tables name counts once with the fallback's device and the Top-N's
time, bytes, bandwidth and bound; a row naming an op in no program stays unmatched; a cut name two ops share is
listed as ambiguous; ``placement --json`` lists ``matched_ops``."""

from __future__ import annotations

import json

import pytest

from analyzer.analysis.record import load_analysis
from analyzer.cli import main
from analyzer.measure.placement import is_compute, join_plan, parse_plan
from tests.placement_plans import anemll_report, trunc_name

pytestmark = pytest.mark.conversion
SLICE_REASON = "ane: Cannot support standalone slice_update"  # the reason anemll-profile's README quotes
GATHER = "hidden_states_1_cast_uint16_cast_uint16"


@pytest.fixture(scope="module")
def tiny(tiny_builds):
    return load_analysis(tiny_builds["qfold"])


def top_rows(analysis, n: int = 20):
    """The n compute ops moving the most bytes (not the cache writes, which the fallback puts on the CPU), with a
    cost-model time of bytes at 60 GB/s; and the gather, which the fallback table names too."""
    ops = [op for op in analysis.program.ops if is_compute(op.type) and op.type not in ("slice_update", "gather")
           and op.outputs]
    ops.sort(key=lambda op: -analysis.account.ops[op.index].total)
    chosen = [*ops[: n - 1], next(op for op in analysis.program.ops if op.name == GATHER)]
    rows = []
    for op in chosen:
        moved = max(analysis.account.ops[op.index].total, 1000)
        rows.append((op.outputs[0].name, op.type, moved / 60e9 * 1e3, moved / 1e6, "Memory"))
    return rows


def fallback_rows(analysis, writes=None):
    writes = writes or [op.name for op in analysis.program.ops if op.type == "slice_update"]
    return ([(name, "slice_update", "CPU", "CPU", SLICE_REASON) for name in writes]
            + [(GATHER, "gather", "CPU", "CPU,ANE", "ANE supported but not preferred")])


def test_every_top_n_and_fallback_row_joins_and_an_op_two_tables_name_counts_once(tiny, tmp_path, capsys):
    top, fallback = top_rows(tiny), fallback_rows(tiny)
    writes = [name for name, *_ in fallback[:-1]]
    assert len(writes) == 4 and all(len(w) > 40 for w in writes)  # cut by the fallback table's 40-wide column
    assert {trunc_name(w, 40) for w in writes} == {"..e_0_internal_tensor_assign_1_cast_fp16",
                                                   "..e_1_internal_tensor_assign_1_cast_fp16"}  # k and v alike
    text = anemll_report("tiny-qfold.mlpackage", top, fallback)
    plan = parse_plan(text.encode(), "report.txt")
    assert plan.accepted and plan.issues == () and len(plan.ops) == 20 + 5
    j = join_plan(plan, tiny)
    assert j.unmatched_plan == () and j.n_matched == 20 + 5 - 1  # the gather is named by both tables: once
    by_name = {op.name: op for op in j.matched if not op.inferred}
    gather = by_name[GATHER]
    assert (gather.device, gather.tables, gather.reason) == ("CPU", ("top_ops", "fallback"),
                                                             "ANE supported but not preferred")
    name, op_type, ms, mb, _ = top[0]
    first = by_name[name]
    assert (first.device, first.tables, first.bound, first.op_type) == ("ANE", ("top_ops",), "Memory", op_type)
    assert first.estimate_ms == pytest.approx(ms, abs=5e-7) and first.moved_bytes == round(round(mb, 2) * 1e6)
    assert first.bytes_per_s == pytest.approx(round(mb / ms, 2) * 1e9)
    assert {by_name[w].device for w in writes} == {"CPU"}
    compute = sum(1 for op in tiny.program.ops if is_compute(op.type))
    assert j.device("CPU").ops == 5 and j.device("ANE").ops == compute - 5  # the rest inferred on the ANE

    report, analysis = tmp_path / "report.txt", tiny.file
    report.write_text(text)
    assert main(["placement", str(report), analysis, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["matched"] == 24 and len(doc["matched_ops"]) == 24 and doc["ambiguous"] == []
    listed = {m["name"]: m for m in doc["matched_ops"]}
    assert listed[GATHER]["device"] == "CPU" and listed[GATHER]["time_basis"] == "cost-model estimate"
    assert (listed[name]["device"], listed[name]["bound"], listed[name]["bytes"]) == (
        "ANE", "Memory", first.moved_bytes)
    assert all(listed[w]["time_ms"] is None and listed[w]["bytes"] is None for w in writes)  # the source gives none


def test_a_row_naming_no_op_stays_unmatched_and_a_cut_name_two_ops_share_is_ambiguous(tiny):
    top = [*top_rows(tiny, 19), ("var_99999_cast_fp16_of_no_program", "mul", 0.01, 0.5, "Memory")]
    k1, v1 = (op.name for op in tiny.program.ops if op.type == "slice_update" and op.layer == 1)
    fallback = fallback_rows(tiny, [op.name for op in tiny.program.ops if op.type == "slice_update"
                                    and op.layer == 0] + [k1])  # one row for layer 1: k or v? it cannot say
    j = join_plan(parse_plan(anemll_report("x", top, fallback).encode(), "r.txt"), tiny)
    cut, ghost = sorted(j.unmatched_plan, key=lambda u: u.label)
    assert (ghost.label, ghost.why, ghost.ambiguous) == ("var_99999_cast_fp16_of_no_program",
                                                         "no op record has this output name", False)
    assert cut.label == "..e_1_internal_tensor_assign_1_cast_fp16" and cut.ambiguous
    assert set(cut.candidates) == {k1, v1} and cut.why.startswith("ambiguous")
    assert k1 not in {op.name for op in j.matched if not op.inferred}  # matches nothing: both stay inferred
    assert j.to_json()["ambiguous"] == [cut.to_json()] and j.n_matched == 19 + 3 - 1
