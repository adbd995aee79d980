"""The device model on synthetic logs made with plain arithmetic here (not with the fitting code).

The graphs mimic EXAONE 4.0 1.2B (30 layers, 8 KV heads, head_dim 64, group 4; design.md): per decode token
kv_read = 2·30·8·64·2 B = 61,440 B per ctx slot, the 60 repeat_kv tiles write and re-read 491,520 B per slot,
kv_write is one slot (61,440 B), weights depend on the compression only, activations are affine in ctx and the
same for both variants, and repeat_kv has 120 more non-const ops than Q-fold.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from analyzer.predict.timing_model import GraphPoint, Observation, fit_device_model
from analyzer.predict.timing_select import select_graphs

CTXS = (512, 1024, 2048, 4096, 8192)
WEIGHTS = {"fp16": 2_560_000_000, "top8": 900_000_000, "int4": 700_000_000}
OPS = {"repeat_kv": 2_303, "qfold": 2_183}


def graph(variant: str, compression: str, ctx: int) -> GraphPoint:
    b = {
        "weights": WEIGHTS[compression],
        "kv_read": 61_440 * ctx,
        "kv_write": 61_440,
        "replication": 491_520 * ctx if variant == "repeat_kv" else 0,
        "activations": 1_000_000 + 1_000 * ctx,
    }
    return GraphPoint(f"{variant}-{compression}-ctx{ctx}", tuple(b.items()), OPS[variant], ctx)


def seconds(g: GraphPoint, *, bw_weights: float, bw_kv: float, tau: float, t0: float) -> float:
    """The known device model, written out: weights at one bandwidth, every other byte at another."""
    b = dict(g.bytes)
    other = b["kv_read"] + b["kv_write"] + b["replication"] + b["activations"]
    return b["weights"] / bw_weights + other / bw_kv + g.n_ops * tau + t0


TRUTH = {"bw_weights": 60e9, "bw_kv": 90e9, "tau": 2e-6, "t0": 1.5e-3}


def logs(variants, compressions, *, truth=TRUTH, noise=0.0, seed=0, graph_of=graph):
    rng = np.random.default_rng(seed)
    obs, graphs = [], []
    for v in variants:
        for c in compressions:
            for ctx in CTXS:
                g = graph_of(v, c, ctx)
                t = seconds(g, **truth) * (1.0 + noise * rng.standard_normal())
                obs.append(Observation("M1 Max", f"{v}-{c}", t, 1, ctx))
                graphs.append(g)
    return obs, graphs


def estimates(fit) -> dict[str, tuple[float, float]]:
    return {t.name: (t.value, t.value_se) for t in fit.terms}


def expected() -> dict[str, float]:
    # kv_write is the same in every row, so its time (61,440 B / BW_kv) can only show up inside t0
    return {"weights": TRUTH["bw_weights"], "kv_read": TRUTH["bw_kv"], "replication": TRUTH["bw_kv"],
            "ops": TRUTH["tau"], "t0": TRUTH["t0"] + 61_440 / TRUTH["bw_kv"]}


def test_noise_free_fit_recovers_every_parameter_within_one_percent():
    obs, graphs = logs(("repeat_kv", "qfold"), WEIGHTS)
    fit = fit_device_model(obs, graphs, device="M1 Max")
    got = estimates(fit)
    assert set(got) == set(expected())
    for name, truth in expected().items():
        assert got[name][0] == pytest.approx(truth, rel=0.01), name
    notes = {n.name: n for n in fit.notes}
    assert notes["kv_write"].status == "not identifiable" and notes["kv_write"].into == "t0"
    assert notes["activations"].into == "kv_read"  # affine in ctx: pooled with the KV stream
    assert fit.rms_residual_pct < 1e-6 and fit.rank == 5 and fit.degrees_of_freedom == 30 - 5
    assert fit.physical and "kv_write" in fit.verdict


def test_with_three_percent_noise_every_parameter_is_within_three_standard_errors():
    obs, graphs = logs(("repeat_kv", "qfold"), WEIGHTS, noise=0.03, seed=7)
    fit = fit_device_model(obs, graphs)
    for name, truth in expected().items():
        value, se = estimates(fit)[name]
        assert math.isfinite(se) and se > 0
        assert abs(value - truth) < 3 * se, (name, value, truth, se)
    assert 1.5 < fit.sigma_pct < 4.5  # the noise it was given, estimated back
    assert fit.loo_rms_pct > fit.rms_residual_pct  # held-out error is the honest one
    assert len(fit.residuals) == 30 and all(0 < r.leverage < 1 for r in fit.residuals)


@pytest.mark.parametrize("truth_variant", ["repeat_kv", "qfold"])
def test_selection_picks_the_graph_the_logs_came_from(truth_variant):
    shared = {"bw_weights": 70e9, "bw_kv": 70e9, "tau": 0.0, "t0": 2e-3}
    obs, _ = logs((truth_variant,), WEIGHTS, truth=shared, noise=0.03, seed=3)
    rows = [(c, ctx) for c in WEIGHTS for ctx in CTXS]
    candidates = {v: [graph(v, c, ctx) for c, ctx in rows] for v in ("repeat_kv", "qfold")}
    sel = select_graphs(obs, candidates, device="M1 Max")
    assert sel.best == truth_variant, sel.verdict
    by_set = {c.term_set: c for c in sel.comparisons}
    assert by_set["shared"].best == truth_variant and by_set["shared"].margin > 3
    # with a free KV bandwidth, copies ∝ ctx look exactly like slower KV reads: said, not guessed
    assert by_set["per-category"].best is None
    assert ("repeat_kv", "qfold") in by_set["per-category"].indistinguishable
    assert "cannot be told apart" in by_set["per-category"].verdict


def test_a_sweep_that_cannot_separate_terms_says_so():
    obs, graphs = logs(("qfold",), ("fp16",))  # ctx varies, compression does not
    fit = fit_device_model(obs, graphs)
    notes = {n.name: n for n in fit.notes}
    assert notes["weights"].status == "not identifiable" and notes["weights"].into == "t0"
    assert notes["ops"].status == "not identifiable"
    assert notes["replication"].status == "absent"
    assert {t.name for t in fit.terms} == {"t0", "kv_read"}
    assert "not identifiable from these logs: weights" in fit.verdict
    # and with ctx fixed instead, the KV terms cannot be told from t0
    obs2, graphs2 = [], []
    for c in WEIGHTS:
        g = graph("qfold", c, 4096)
        obs2.append(Observation("d", c, seconds(g, **TRUTH)))
        graphs2.append(g)
    fit2 = fit_device_model(obs2, graphs2)
    assert {n.name for n in fit2.notes if n.status == "not identifiable"} >= {"kv_read", "ops", "kv_write"}


def test_bad_inputs_are_rejected():
    g = graph("qfold", "fp16", 512)
    with pytest.raises(ValueError, match="one graph per observation"):
        fit_device_model([Observation("d", "b", 0.01)], [g, g])
    with pytest.raises(ValueError, match="finite number > 0"):
        fit_device_model([Observation("d", "b", 0.0)], [g])
    with pytest.raises(ValueError, match="two hypotheses"):
        select_graphs([Observation("d", "b", 0.01)], {"a": [g]})


# ------------------------------------------------------------------------------------------------- logs + sweep table
def _table_rows():
    rows = []
    for v in ("repeat_kv", "qfold"):
        for c in WEIGHTS:
            for ctx in CTXS:
                g = graph(v, c, ctx)
                b = dict(g.bytes)
                rows.append({"model": "exaone", "model_label": "exaone", "compression": c, "variant": v, "ctx": ctx,
                             "key": g.label, "status": "built", "tile_count": 60 if v == "repeat_kv" else 0,
                             "non_const_ops": g.n_ops, **{f"bytes_{k}": x for k, x in b.items()},
                             "bytes_total": sum(b.values())})
    return rows


def test_runs_are_averaged_as_seconds_per_token_and_conditions_never_pooled():
    from analyzer.measure.logs import Measurement
    from analyzer.sweep.timing_report import observations_from

    runs = [Measurement("f", 2, "d", "b", 10.0, context_length=512), Measurement("f", 3, "d", "b", 30.0,
                                                                                 context_length=512),
            Measurement("f", 4, "d", "b", 30.0, context_length=1024),
            Measurement("f", 5, "d", "b", 30.0, context_length=512, compute_units="cpuAndGPU"),
            Measurement("f", 6, "d", "b", 900.0, context_length=512, phase="prefill")]  # never a decode step
    obs = {(o.context_length, o.n_runs): o for o in observations_from(runs)}
    assert len(obs) == 3 and all(o.tok_per_s < 100 for o in obs.values())
    assert obs[(512, 2)].source == "f:2,3"
    assert obs[(512, 2)].tok_per_s == pytest.approx(15.0)  # 1 / mean(0.1 s, 0.0333 s), not mean(10, 30) = 20


def test_fit_cli_shows_the_device_model_and_the_selection(tmp_path, capsys):
    import json

    from analyzer.cli import main

    table = tmp_path / "sweep.json"
    table.write_text(json.dumps(_table_rows()))
    shared = {"bw_weights": 70e9, "bw_kv": 70e9, "tau": 0.0, "t0": 2e-3}
    rng = np.random.default_rng(1)
    lines = ["device,build,tok_per_s,context_length"]
    for c in WEIGHTS:
        for ctx in CTXS:
            t = seconds(graph("repeat_kv", c, ctx), **shared) * (1 + 0.02 * rng.standard_normal())
            lines.append(f"M1 Max,exaone-{c},{1 / t:.4f},{ctx}")
    lines.append("M1 Max,exaone-fp16,20.0,3000")  # a context_length no build has
    log = tmp_path / "log.csv"
    log.write_text("\n".join(lines) + "\n")
    assert main(["fit", str(log), "--sweep", str(table)]) == 0
    text = capsys.readouterr().out
    assert "Device model on M1 Max" in text and "variant=repeat_kv explains the measurements better" in text
    assert "context_length 3000 differs from every mapped build's ctx" in text
    assert main(["fit", str(log), "--sweep", str(table), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    device = payload["device_model"]["devices"][0]
    assert device["selection"]["best"] == "variant=repeat_kv"
    assert {f["hypothesis"] for f in device["fits"]} == {"variant=repeat_kv", "variant=qfold"}
    assert main(["fit", str(log), "--sweep", str(table), "--map", "exaone-fp16=colour:red"]) == 2
    assert "no column(s) colour" in capsys.readouterr().err


def test_published_examples_import_without_issues():
    from pathlib import Path

    from analyzer.measure.logs import parse_logs

    path = Path(__file__).resolve().parent.parent / "examples" / "apple_llama31_coreml_m1max.csv"
    imported = parse_logs([(path.name, path.read_bytes())])
    assert not imported.issues, [i.describe() for i in imported.issues]
    rates = {(m.build, m.context_length): m.tok_per_s for m in imported.measurements}
    assert len(rates) == 14  # Apple's Tables 3 and 4, seven context sizes each
    assert rates[("llama-3.1-8b-instruct-fp16-state", 2048)] == 16.26  # the article's headline fp16 figure
    assert rates[("llama-3.1-8b-instruct-int4-state", 2048)] == 33.67  # and its "~33 tokens/s"
    assert all("Apple ML Research" in m.notes for m in imported.measurements)
