"""Core AI on the dashboard (issue 19, item 7), in Streamlit's AppTest: the Builds form offers each backend what it
builds and refuses the rest with the reason before anything is queued; the Builds page analyses an .aimodel, folds a
Core AI build (proven on the Core AI runtime) and benches Core AI builds with progress; the bench's log rows reach
the Device logs page (mapped to their builds by their own labels) and the Bandwidth page (fitted), beside the
uploaded logs. Real builds: the session's tiny Core AI builds (conftest ``coreai_builds``)."""

from __future__ import annotations

import pytest

from analyzer.report.catalog import catalog
from analyzer.report.coreai_view import asset_of, bench_targets, fold_targets
from tests.test_app import EXAMPLE_LOG, open_page, texts

BUILDS = "app_pages/builds.py"


def button(at, label: str):
    return next(b for b in at.button if b.label == label)


def ok(at):
    assert not at.exception, [e.value for e in at.exception]
    return at


# ---------------------------------------------------------------------------------------------- the build form
def test_the_form_offers_each_backend_what_it_builds_and_refuses_the_rest(builds_root):
    pytest.importorskip("coreai_torch")
    at = open_page(BUILDS, builds_ctx=64, builds_layers=2)
    assert at.radio(key="builds_backend").options == ["Core ML (.mlpackage)", "Core AI (.aimodel)"]
    assert "sdpa_gqa" not in at.multiselect(key="builds_variants").options  # Core ML: never offered
    at.radio(key="builds_backend").set_value("coreai").run()
    assert "sdpa_gqa" in at.multiselect(key="builds_variants").options
    at.radio(key="builds_mode").set_value("materialised").run()
    at.radio(key="builds_weights").set_value("fp32").run()
    at.multiselect(key="builds_variants").set_value(["sdpa_gqa", "qfold"]).run()
    assert not at.error and not at.button(key="builds_convert").disabled
    assert any("Core AI: torch.export → coreai-torch" in c for c in texts(at.caption))

    at.radio(key="builds_backend").set_value("coreml").run()  # the kept sdpa_gqa is taken off, saying why
    ok(at)
    assert any(w.startswith("sdpa_gqa is not built with coreml: coremltools 9.0 ignores "
                            "scaled_dot_product_attention's enable_gqa") for w in texts(at.warning)), texts(at.warning)
    assert at.multiselect(key="builds_variants").value == ["qfold"]
    errors = texts(at.error)  # fp32 weights: Core AI only
    assert any("weights fp32 backend coreml: a Core ML build computes in fp16" in e for e in errors), errors
    assert not any("--" in e for e in errors) and at.button(key="builds_convert").disabled

    at.radio(key="builds_backend").set_value("coreai").run()
    at.selectbox(key="builds_compression").set_value("top8").run()  # materialised: coreai-opt compresses it
    assert not at.error and not at.button(key="builds_convert").disabled
    at.radio(key="builds_weights").set_value("fp16").run()
    at.radio(key="builds_mode").set_value("analysis").run()  # value-free weights: no LUT to compute
    errors = texts(at.error)
    assert any("compression: coreai-opt computes each LUT" in e and "build it materialised" in e
               for e in errors), errors
    assert at.button(key="builds_convert").disabled
    at.selectbox(key="builds_compression").set_value("none").run()
    assert not at.error and not at.button(key="builds_convert").disabled
    at.radio(key="builds_weights").set_value("fp32").run()  # value-free weights are fp16 views
    assert any("value-free weights are fp16 views" in e for e in texts(at.error))
    at.radio(key="builds_weights").set_value("fp16").run()
    assert not at.error and not at.button(key="builds_convert").disabled


# ---------------------------------------------------------------------------------------------- existing models
def test_the_catalog_knows_which_analyses_have_a_core_ai_asset(coreai_builds, tiny_builds):
    refs = catalog()
    benchable = {r.id for r in bench_targets(refs)}
    assert {f"build:{p.name}" for p in coreai_builds.values()} <= benchable
    assert not any(f"build:{p.name}" in benchable for p in tiny_builds.values())  # Core ML builds: no runtime here
    foldable = {r.variant for r in fold_targets(refs) if r.kind == "build"}
    assert foldable == {"repeat_kv", "sdpa_gqa"}  # a Q-fold build has nothing to fold
    by_id = {r.id: r for r in refs}
    assert asset_of(by_id[f"build:{coreai_builds['qfold'].name}"]) == coreai_builds["qfold"] / "model.aimodel"


def test_an_aimodel_is_analysed_on_the_builds_page(coreai_builds, monkeypatch):
    asset = coreai_builds["sdpa_gqa"] / "model.aimodel"
    monkeypatch.setenv("QFOLD_DATA_ROOTS", str(coreai_builds["sdpa_gqa"].parent))
    at = open_page(BUILDS)
    at.text_input(key="builds_package_path").input(str(asset))
    ok(button(at, "Analyse").click().run())
    done = " ".join(texts(at.success))
    assert "model.aimodel" in done and "4 replication ops" in done and "in the A/B pickers" in done, done
    assert at.session_state["builds_packages"] == [str(asset.resolve())]
    at.text_input(key="builds_package_path").input(str(coreai_builds["sdpa_gqa"] / "analysis.json"))
    ok(button(at, "Analyse").click().run())
    assert any("not a .mlpackage or .aimodel folder on this server" in e for e in texts(at.error))


def test_a_core_ai_build_is_folded_and_the_ab_shows_the_runtime_proof(coreai_builds):
    asset = str(coreai_builds["repeat_kv"] / "model.aimodel")
    at = open_page(BUILDS)
    at.selectbox(key="builds_fold_pick").set_value(asset)
    ok(button(at, "Fold it").click().run())
    done = " ".join(texts(at.success))
    assert "4 of 4 replication ops folded" in done and "bit-identical over 4 decode steps in the Core AI runtime" \
        in done, done
    assert at.session_state["ab_a"] == f"build:{coreai_builds['repeat_kv'].name}"
    folded = at.session_state["builds_packages"][-1]
    assert folded.endswith("model.aimodel") and "/.folds/" in folded and at.session_state["ab_b"] == f"package:{folded}"
    at.switch_page("app_pages/ab.py")
    ok(at.run())
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["tile ops, A → B"] == "4 → 0"
    eq = " ".join(texts(at.success))
    assert "Core AI runtime, folded vs original" in eq and "bit-identical" in eq, eq


def test_a_bench_of_two_core_ai_builds_reaches_the_logs_and_the_bandwidth_fit(coreai_builds):
    ids = [f"build:{coreai_builds[v].name}" for v in ("repeat_kv", "qfold")]
    at = open_page(BUILDS)
    at.multiselect(key="builds_bench_pick").set_value(ids)
    at.number_input(key="builds_bench_steps").set_value(2)
    at.number_input(key="builds_bench_rounds").set_value(2)
    at.number_input(key="builds_bench_warmup").set_value(0)
    ok(button(at, "Bench").click().run())
    assert [s.label for s in at.status] == ["Timed 2 build(s): 2 rounds of 2 decode steps"]
    assert [s.state for s in at.status] == ["complete"]
    table = next(d.value for d in at.dataframe if "tok/s (median)" in d.value.columns)
    labels = list(table["build"])
    assert len(labels) == 2 and all(" · Core AI · build " in label for label in labels)  # the pickers' labels
    assert (table["tok/s (median)"] > 0).all() and table["× first"].iloc[0] == 1.0
    assert any("fp16 matmul kernel" in i for i in texts(at.info))  # fp16 builds on Linux: said
    (name, data), = at.session_state["logs_bench"]
    assert name.startswith("qfold bench ") and data.decode().count("\n") == 3  # header + one row per build

    at.switch_page("app_pages/device_logs.py")
    ok(at.run())
    assert any(i.startswith("1 log(s) from bench runs on the Builds page") for i in texts(at.info))
    assert any("beside your 1 log(s)" in i for i in texts(at.info))  # a bench log adds to the example
    mapping = at.session_state["logs_mapping"]
    assert [mapping[label] for label in labels] == ids  # each row maps back to its build by its own label
    assert sum(c == "Mapped by its label: the label is this analysis's own." for c in texts(at.caption)) == 2
    ok(at.button(key="logs_example_remove").click().run())  # the bench's rows alone from here

    at.switch_page("app_pages/bandwidth.py")
    ok(at.run())
    assert not any("Not on the chart" in c for c in texts(at.caption))
    verdicts = texts(at.success) + texts(at.warning)
    assert any("Core AI runtime" in v and "needs ≥ 2 builds" not in v for v in verdicts), verdicts  # fitted

    at.switch_page("app_pages/device_logs.py")  # an upload (here: a paste, read the same way) joins them
    at.run()
    at.text_area(key="logs_paste_text").input(EXAMPLE_LOG.read_text())
    ok(button(at, "Read the pasted text").click().run())
    files = next(d.value for d in at.dataframe if "format" in d.value.columns)
    assert list(files["file"]) == ["pasted text 1", name] and list(files["format"]) == ["qfold-csv"] * 2


HOLD_BENCH = ("import sys, time\nfrom pathlib import Path\nfrom analyzer.convert.builds_folder import bench_lock\n"
              "with bench_lock(Path(sys.argv[1]), 'a test holding the lock', print):\n"
              "    print('held', flush=True)\n    time.sleep(600)\n")


def test_one_bench_at_a_time_per_builds_folder_the_next_one_waits_and_says_for_what(coreai_builds, tmp_path):
    """The dashboard's bench is ``qfold bench`` in a child (``analyzer.cli.delegate``), under the builds folder's
    bench lock: while another process holds it, the child says whom it waits for (the Builds page shows that
    line as the bench's state) and starts once the lock is free; its waiting is not counted against its limit."""
    import subprocess
    import sys

    from analyzer.cli.delegate import WAITING, bench_in_child
    from analyzer.convert.launch import REPO_ROOT, child_env

    holder = subprocess.Popen([sys.executable, "-c", HOLD_BENCH, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=REPO_ROOT, env=child_env())
    assert holder.stdout.readline() == "held\n"
    said = []

    def on_line(line: str) -> None:
        said.append(line)
        if line.startswith(WAITING) and holder.poll() is None:
            holder.kill()  # the other bench ends: this one goes on
            holder.wait()

    asset = asset_of(next(r for r in bench_targets(catalog(coreai_builds["qfold"].parent))
                          if r.id == f"build:{coreai_builds['qfold'].name}"))
    try:
        result, log = bench_in_child([asset], ["q"], 1, 1, 0, tmp_path, on_line)
    finally:
        holder.kill()
        holder.wait()
    waits = [ln for ln in said if ln.startswith(WAITING)]
    assert waits and waits[0].startswith(f"{WAITING}waiting for the bench of pid {holder.pid} (since ")
    assert waits[0].endswith(" UTC: a test holding the lock) to finish"), waits[0]
    assert any(ln.startswith("progress: ") for ln in said)
    assert [t.label for t in result.targets] == ["q"] and result.targets[0].tok_per_s_median > 0
    assert log.count("\n") == 2  # the header and the one build's row
