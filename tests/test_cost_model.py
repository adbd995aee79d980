"""The cost model against measurement (issue 43, item 6; issue 44, item 4): every request kind measured by
``bench/cost_model.py`` (bench/results/cost_model.json: both backends, both build modes, 2 layers to 70B, decode,
prefill, decode+prefill, compressed) is estimated within 25% of its measured peak, the error the model states is no
smaller than what the rows show, and a request is refused only when even the low end of its estimate does not fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.errors import SourceError
from analyzer.model.cost import FIT, MEMORY_LIMIT_ENV, check_request, estimate, estimate_builds
from analyzer.model.sources import load_config, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, MATERIALISED_MODE
from bench.cost_model import TOLERANCE, Kind

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results" / "cost_model.json"
ROWS = json.loads(RESULTS.read_text())["rows"]


def _kind(row: dict) -> Kind:
    k = row["kind"]
    return Kind(**{**k, "variants": tuple(k["variants"]), "overrides": tuple(k["overrides"])})


# Not done (issue 43, item 6): Core AI's analysis mode peaks at 2.8 GB for EXAONE 1.2B (two runs) but 1.6 GB for
# Llama 3.2 1B and 2.0-2.5 GB for Llama 3.1 8B, and 1.1 GB for EXAONE's 30-layer structure A/B: a term none of the
# features (layers, KV, weights, width, tied embeddings) explains, so the best fit is ±40% there. Strict: a model that
# explains them turns these into passes, and the marks must go.
CORE_AI_ANALYSIS_GAP = {"coreai-an-exaone-qfold", "coreai-an-2layer-ab", "coreai-an-structure-ab"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason="Core AI analysis "
                                                                                  "mode: ±40%, see above"))
                                  if n in CORE_AI_ANALYSIS_GAP else n for n in sorted(ROWS)])
def test_every_measured_kind_is_estimated_within_25_percent(name):
    row = ROWS[name]
    cost = estimate_builds(_kind(row).specs())
    measured = row["peak_rss_tree_bytes"]
    off = cost.peak_rss_bytes / measured - 1
    assert abs(off) <= cost.error + 1e-9  # the error it states covers what was measured
    assert abs(off) <= TOLERANCE, f"{name}: estimated {cost.peak_rss_bytes / 1e9:.2f} GB, measured {measured / 1e9:.2f}"
    if row.get("cpu_s"):  # CPU seconds: what the machine's load does not stretch
        assert abs(cost.cpu_s / row["cpu_s"] - 1) <= TOLERANCE, (name, cost.cpu_s, row["cpu_s"])


def test_the_default_pair_and_a_2_layer_core_ai_pair_are_estimated_within_25_percent():
    """Issue 44's bench figures: the Builds page's default request (the structure A/B, Core ML, analysis mode) and a
    2-layer Core AI pair (materialised; its analysis-mode row is the gap above), peak and CPU time."""
    for name in ("coreml-an-structure-ab", "coreai-mat-2layer-ab"):
        row = ROWS[name]
        cost = estimate_builds(_kind(row).specs())
        assert abs(cost.peak_rss_bytes / row["peak_rss_tree_bytes"] - 1) <= TOLERANCE, name
        assert abs(cost.cpu_s / row["cpu_s"] - 1) <= TOLERANCE, name


def test_the_rows_cover_both_backends_both_modes_and_2_layers_to_70b():
    kinds = [_kind(r) for r in ROWS.values()]
    assert {(k.backend, k.mode) for k in kinds} == set(FIT)
    params = [r["params"] for r in ROWS.values()]
    assert min(params) < 10e6 and max(params) > 70e9
    assert {k.phase for k in kinds} >= {"decode", "prefill"} and any(k.compression for k in kinds)


def test_a_request_is_refused_only_when_even_its_low_end_does_not_fit(monkeypatch):
    config = load_config(resolve_source("exaone-4.0-1.2b"))
    cost = estimate(config, 4096, MATERIALISED_MODE)
    monkeypatch.setenv(MEMORY_LIMIT_ENV, str(cost.peak_rss_bytes))  # the estimate itself: may not fit, not refused
    assert check_request(config, 4096).may_not_fit
    monkeypatch.setenv(MEMORY_LIMIT_ENV, str(cost.low_bytes - 1))
    with pytest.raises(SourceError, match=r"does not fit: .*at least"):
        check_request(config, 4096)


def test_an_analysis_ab_converts_its_variants_at_once_unless_the_model_is_tiny():
    """Analysis mode converts an A/B's second variant in a worker beside the child (two copies of the graph at
    once), except for a model no larger than the equivalence check's reduced one (converted in turn)."""
    structure = load_config(resolve_source("exaone-4.0-1.2b", ["hidden_size=256", "intermediate_size=512",
                                                                "vocab_size=1000"]))
    tiny = load_config(resolve_source("exaone-4.0-1.2b", ["hidden_size=256", "intermediate_size=512",
                                                           "vocab_size=1000", "num_hidden_layers=2"]))
    one, two = (estimate(structure, 4096, ANALYSIS_MODE, builds=n).peak_rss_bytes for n in (1, 2))
    assert two > one
    one, two = (estimate(tiny, 4096, ANALYSIS_MODE, builds=n).peak_rss_bytes for n in (1, 2))
    assert two == one
