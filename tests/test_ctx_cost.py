"""What a build pays for a large ctx where no value needs it (issue 40, item 2; bench/ctx_cost.py measures it): the
torch equivalence check of a decode step runs at most at ctx 4096, in the build's ctx regime, and says so."""

from __future__ import annotations

from analyzer.convert.checks import EQUIVALENCE_CTX_CAP, equivalence_ctx, torch_check
from analyzer.model.equivalence_records import EquivalenceReport, PairResult, ReferenceCheck
from analyzer.model.sources import resolve_source
from analyzer.model.spec import ANALYSIS_MODE, BuildSpec


def _spec(preset: str, ctx: int, overrides=(), **kw) -> BuildSpec:
    return BuildSpec(resolve_source(preset, list(overrides)), "qfold", "state", ctx, build_mode=ANALYSIS_MODE, **kw)


def test_the_equivalence_check_runs_at_most_at_4096_in_the_build_s_regime():
    assert EQUIVALENCE_CTX_CAP == 4096
    assert equivalence_ctx(_spec("llama-3.1-8b", 2048)) == 2048
    assert equivalence_ctx(_spec("llama-3.1-8b", 32768)) == 4096
    # a window between 4096 and the build's ctx: its window-mask ops exist only above it, so the build's ctx stays
    assert equivalence_ctx(_spec("mistral-7b-v0.3", 32768, ["sliding_window=6000"])) == 32768
    # a window below both: both slide, the same step
    assert equivalence_ctx(_spec("mistral-7b-v0.3", 32768, ["sliding_window=1024"])) == 4096
    # a prefill check's prompt length depends on ctx: kept
    assert equivalence_ctx(_spec("llama-3.1-8b", 32768, phase="prefill", q_len=64)) == 32768


def test_a_check_at_another_ctx_says_so():
    pair = PairResult("repeat_kv", "qfold", "fp16", 8, 0.0, True, 8)
    report = EquivalenceReport("state", 4096, 8, tuple(range(8)), (pair,), ReferenceCheck("repeat_kv", 0, 1, 8, 8))
    note = torch_check(report, _spec("llama-3.1-8b", 32768)).note
    assert "run at ctx 4096, not the build's 32768" in note and "masked" in note
    assert "not the build's" not in torch_check(report, _spec("llama-3.1-8b", 4096)).note
