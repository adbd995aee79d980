"""``coreai-build inspect --ops --json`` (tests/data/placement/coreai_inspect_tiny.json, written from the documented
summary with the op distribution of a tiny repeat_kv Core AI asset) joined to the tiny Core AI builds converted
here: every operation count agrees with the repeat_kv asset's op types; the Q-fold asset has no broadcast_in_dims
(its copies folded away), which the join names; nothing is placed per op and no segments are claimed."""

from __future__ import annotations

import json

import pytest

from analyzer.analysis.record import load_analysis
from analyzer.cli import main
from analyzer.measure.placement import join_plan, parse_plan
from tests.test_placement_readers import DATA

pytestmark = pytest.mark.conversion


def test_the_summarys_counts_are_the_assets_op_types_and_the_fold_shows_in_them(coreai_builds, capsys):
    plan = parse_plan((DATA / "coreai_inspect_tiny.json").read_bytes(), "inspect.json")
    repeat_kv = load_analysis(coreai_builds["repeat_kv"] / "model.aimodel")
    j = join_plan(plan, repeat_kv)
    assert all(p == a for _, p, a in j.op_counts) and len(j.op_counts) == 22
    assert (j.n_matched, j.segments, j.unmatched_plan) == (0, None, ())
    qfold = join_plan(plan, load_analysis(coreai_builds["qfold"] / "model.aimodel"))
    differ = {n: (p, a) for n, p, a in qfold.op_counts if p != a}
    assert differ["coreai.broadcast_in_dims"] == (4, 0)  # the KV copies of repeat_kv, none in the Q-fold
    assert main(["placement", str(DATA / "coreai_inspect_tiny.json"), str(coreai_builds["repeat_kv"] / "model.aimodel"),
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["matched"], doc["matched_ops"], doc["segments"], doc["coverage"]) == (0, [], None, "op_counts")
    assert {c["operation"]: c["plan"] - c["analysis"] for c in doc["op_counts"]} == dict.fromkeys(
        (c["operation"] for c in doc["op_counts"]), 0)
