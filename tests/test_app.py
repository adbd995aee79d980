"""AppTest smoke tests: every page opens without an exception and shows what it is for.

The pages run against the session's tiny builds (conftest ``tiny_builds``, a temporary ``$QFOLD_BUILDS``) and
the shipped default analyses when they are installed; expected numbers are read from the same analyses.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.components.v2.component_manager import BidiComponentManager
from streamlit.testing.v1 import AppTest

from analyzer import fmt
from analyzer.convert import jobs
from analyzer.convert.launch import BuildResult
from analyzer.errors import BuildError
from analyzer.measure.logs import parse_logs, summarize
from analyzer.model.sources import resolve_source
from analyzer.model.spec import BuildSpec
from analyzer.report.catalog import catalog, default_pair, measured_pairs, shipped_analyses
from analyzer.report.labels import default_log_mapping

REPO = Path(__file__).resolve().parent.parent
APP = REPO / "app.py"
EXAMPLE_LOG = REPO / "examples" / "writeup_device_logs.csv"
PAGES = ["app_pages/ab.py", "app_pages/builds.py", "app_pages/device_logs.py", "app_pages/bandwidth.py",
         "app_pages/export.py"]
TIMEOUT_S = 120


_COMPONENTS: list[BidiComponentManager] = []


def new_app(timeout_s: float = TIMEOUT_S) -> AppTest:
    """An AppTest of app.py. Before its first run an AppTest scans the metadata of every installed distribution
    for Streamlit components (profiled: ~6,400 metadata reads, ~1 s of CPU each time); nothing is installed while
    the tests run, so one scan serves every AppTest of the process."""
    at = AppTest.from_file(str(APP), default_timeout=timeout_s)
    if not _COMPONENTS:
        manager = BidiComponentManager()
        manager.discover_and_register_components(start_file_watching=False)
        _COMPONENTS.append(manager)
    at._bidi_component_manager = _COMPONENTS[0]  # what AppTest._run fills in when it is None
    return at


DEFAULT_PAGE = "app_pages/ab.py"
DRILL_TAB = "Ops behind a total"  # the A/B page's drill-down tab (its tabs run only when open)


def open_page(page: str | None = None, **state) -> AppTest:
    """The app on ``page`` (its first run: every page's url_path is its file's name, so the page is found before
    ``st.navigation`` has registered it) with ``state`` set, as a link to that page opens it."""
    at = new_app()
    for key, value in state.items():
        at.session_state[key] = value
    if page is not None and page != DEFAULT_PAGE:
        at.switch_page(page)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    if page not in (None, DEFAULT_PAGE):  # the page asked for, not the default one Streamlit would fall back to
        shown = at._registered_pages.get(at._page_hash, {}).get("script_path")
        assert shown and Path(shown).resolve() == (APP.parent / page).resolve(), (page, shown)
    return at


def texts(elements) -> list[str]:
    """What each element reads as on the page: markdown escapes (``fmt.md_text``) and the code-span fences of
    user values (``fmt.md``) removed, so a test matches the words a user sees."""
    return [plain(str(e.value)) for e in elements]


def plain(markdown: str) -> str:
    unfenced = re.sub(r"(`+) (.*?) \1", lambda m: m.group(2), markdown)
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", unfenced)


@pytest.fixture(scope="module")
def expected_pair(tiny_builds):
    """The two analyses the A/B page opens on (the pair the example device log measured, else the shipped
    default), loaded the way the app loads them."""
    from analyzer.analysis.record import load_analysis

    refs = catalog()
    measured = parse_logs([(EXAMPLE_LOG.name, EXAMPLE_LOG.read_bytes())]).measurements
    labels = list(dict.fromkeys(m.build for m in measured))
    mapping = default_log_mapping(labels, refs)
    pair = default_pair(refs, measured_pairs(refs, mapping, summarize(measured)))
    assert pair is not None
    return load_analysis(pair[0].path), load_analysis(pair[1].path)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_opens(tiny_builds, page):
    at = open_page(page)
    assert at.title, f"{page} has no title"
    assert not any("Traceback" in t for t in texts(at.markdown) + texts(at.error))


def test_ab_page_shows_the_default_pair(expected_pair):
    a, b = expected_pair
    at = open_page()
    metrics = {m.label: m.value for m in at.metric}
    assert set(shipped_analyses()) >= {"repeat_kv", "qfold"}
    # the write-up's figures: 60 tiles × 16 MiB, written and read again
    assert a.summary.tile_count == 60 and b.summary.tile_count == 0
    assert metrics["tile ops, A → B"] == "60 → 0"
    assert metrics["tile output per token, A → B"] == "960 → 0 MiB"
    assert metrics["bytes per token, A → B"] == fmt.change(a.bytes_per_token.total, b.bytes_per_token.total, "auto",
                                                          None)
    assert metrics["bytes per token, A → B"].endswith(" GiB")  # ~3 GiB per token: the unit the value reads best in
    cats = next(d.value for d in at.dataframe if "Δ MiB" in d.value.columns).set_index("category")
    assert cats.loc["replication", "Δ MiB"] == pytest.approx(-1_920.0)
    assert cats.loc["replication", "Δ MB"] == pytest.approx(-2_013.27, abs=0.01)
    # the torch pair ran on uncompressed weights: a compressed (measured top8) pair must not claim bit-identity
    compressed = a.build is not None and a.build.spec.compression is not None
    expected = "uncompressed torch weights" if compressed else "bit-identical"
    assert any(expected in s and "greedy agreement" in s for s in texts(at.success)), texts(at.success)
    assert any("No Core ML runtime on Linux" in c for c in texts(at.caption))
    # the measured (top8) pair states the preset's assumed attention precision; an fp16 pair assumes nothing
    compressed = a.build is not None and a.build.spec.compression is not None
    assert any("Assumed" in c for c in texts(at.caption)) == compressed
    # only the open tab runs: the drill-down's table is drawn when its tab is opened
    assert not any("100.0% of" in m for m in texts(at.markdown))
    at.session_state["ab_tab"] = DRILL_TAB
    at.run()
    # the drill-down tab sums the ops of every category: all of them for the total
    assert any(f"sum {a.bytes_per_token.total:,} bytes" in m and "100.0% of" in m for m in texts(at.markdown))


def test_ab_bandwidth_setting_changes_the_prediction_everywhere(expected_pair):
    at = open_page()
    before = next(m for m in at.metric if m.label.startswith("predicted tok/s"))
    at.radio(key="bwset_ab_source").set_value("typed").run()
    at.number_input(key="bwset_ab_typed").set_value(111_800.0).run()
    after = next(m for m in at.metric if m.label.startswith("predicted tok/s"))
    assert before.label.endswith("55,900 MB/s") and after.label.endswith("111,800 MB/s")
    assert before.value != after.value
    # the one setting: the Bandwidth page and the URL carry the same value
    assert at.session_state["bw_setting"].to_text() == "typed:111800"
    assert at.query_params["bw"] in ("typed:111800", ["typed:111800"])
    at.switch_page("app_pages/bandwidth.py")
    at.run()
    assert at.radio(key="bwset_bw_source").value == "typed"
    assert at.number_input(key="bwset_bw_typed").value == 111_800.0
    assert any("111,800 MB/s" in c for c in texts(at.caption)), texts(at.caption)


def test_ab_drilldown_filters_to_a_layer_and_op_type(expected_pair):
    at = open_page(ab_tab=DRILL_TAB)
    a, _ = expected_pair
    at.selectbox(key="ab_drill_category").set_value("replication")
    at.selectbox(key="ab_drill_layer").set_value(0)
    at.run()
    layer0 = next(r for r in a.bytes_by_layer if r.layer == 0)
    assert any(f"sum {layer0.replication:,} bytes" in m for m in texts(at.markdown)), texts(at.markdown)
    at.selectbox(key="ab_drill_type").set_value("tile").run()
    tile_rows = f"2 ops, sum {layer0.replication // 2:,} bytes"
    assert any(tile_rows in m for m in texts(at.markdown))
    # another tab and back: the filters are as they were (Streamlit forgets widgets it does not draw)
    at.session_state["ab_tab"] = "Bytes by category"
    at.run()
    assert not any(tile_rows in m for m in texts(at.markdown))
    at.session_state["ab_tab"] = DRILL_TAB
    at.run()
    assert at.selectbox(key="ab_drill_type").value == "tile" and at.selectbox(key="ab_drill_layer").value == 0
    assert any(tile_rows in m for m in texts(at.markdown))


def test_ab_page_states_the_top8_assumptions_and_the_weight_charge_option(expected_pair):
    ids = {r.id for r in catalog()}
    top8 = [f"shipped:exaone-4.0-1.2b-{v}-state-ctx4096-top8" for v in ("repeat_kv", "qfold")]
    assert set(top8) <= ids
    at = open_page(ab_a=top8[0], ab_b=top8[1])
    captions = texts(at.caption)
    assert any("Assumed" in c and "pal4 in layers 4-25" in c and "does not state it" in c for c in captions), captions
    assert any("charged as stored" in c for c in captions)
    before = {m.label: m.value for m in at.metric}["bytes per token, A → B"]
    at.radio(key="ab_weight_charge__widget").set_value("decompressed").run()
    after = {m.label: m.value for m in at.metric}["bytes per token, A → B"]
    assert before != after and any("charged dense" in c for c in texts(at.caption))
    assert at.session_state["ab_weight_charge"] == "decompressed"


def test_rebuild_for_real_queues_the_selected_pair_at_full_size(tiny_builds, monkeypatch):
    started: list[BuildSpec] = []

    def fake_run_builds(specs, root=None, on_progress=None, timeout_s=None):
        started.extend(specs)
        return [BuildResult(spec.key, Path(root or "."), True, 0.0) for spec in specs]

    monkeypatch.setattr(jobs, "run_builds", fake_run_builds)
    a, b = (f"build:{tiny_builds[v].name}" for v in ("repeat_kv", "qfold"))
    at = open_page(ab_a=a, ab_b=b, ab_rebuild_popover=True)  # the tiny structure pair, not the default
    at.button(key="ab_rebuild").click().run()
    assert not at.exception
    (job,) = at.session_state["builds_jobs"]
    job._thread.join(timeout=30)
    assert job.snapshot().state == "done"
    # the same model, variants, KV mode and ctx, grown to full size (no structure or layer overrides)
    assert [(s.source.label, s.variant, s.ctx, s.kv_mode, s.source.overrides) for s in started] == [
        ("exaone-4.0-1.2b", "repeat_kv", 256, "state", ()), ("exaone-4.0-1.2b", "qfold", 256, "state", ())]
    assert {s.build_mode for s in started} == {"analysis"}  # full size, value-free: no 15 GB conversion


def test_builds_page_lists_the_cached_builds(tiny_builds):
    at = open_page("app_pages/builds.py")
    options = at.selectbox(key="builds_chosen").options
    for path in tiny_builds.values():  # labelled by what tells builds apart, the hash last
        assert any(o.startswith("exaone-4.0-1.2b · ") and o.endswith(path.name.rsplit("-", 1)[1]) for o in options)
    assert any("Nothing queued" in c or "queue" in c.lower() for c in texts(at.caption))


def test_builds_page_rejects_a_bad_folder(tiny_builds, tmp_path, monkeypatch):
    monkeypatch.setenv("QFOLD_DATA_ROOTS", str(tmp_path))
    at = open_page("app_pages/builds.py")
    at.radio(key="builds_source_kind").set_value("Local model folder").run()
    at.text_input(key="builds_folder").input(str(tmp_path / "missing")).run()
    assert not at.exception
    assert any("not a preset" in e for e in texts(at.error)), texts(at.error)
    assert not any("--" in e for e in texts(at.error))  # no command-line flags on a page
    at.text_input(key="builds_folder").input("/etc").run()  # outside the data roots: refused, existence unsaid
    assert any("outside the folders this server may read" in e for e in texts(at.error)), texts(at.error)


def test_device_logs_default_to_the_writeup_example(tiny_builds):
    at = open_page("app_pages/device_logs.py")
    assert any("Every row accepted (6 runs)" in s for s in texts(at.success))
    labels = [plain(s.label) for s in at.selectbox]  # log labels are user text: fmt.md
    assert "exaone-repeat_kv-top8" in labels and "exaone-qfold-top8" in labels
    mapping = at.session_state["logs_mapping"]
    assert mapping["exaone-repeat_kv-top8"].endswith("-top8") and mapping["exaone-qfold-top8"].endswith("-top8")
    assert mapping["exaone-top8-device-table"] is None


def test_device_logs_report_bad_rows_and_rejected_files(tiny_builds):
    ragged = b"device,build,tok_per_s\nphone,b1,31.2\nphone,b2,31,2\nphone,b3,fast\n"
    binary = b"\x00\x01\x02\x03 not a log"
    at = open_page("app_pages/device_logs.py", logs_files=[("ragged.csv", ragged), ("blob.csv", binary)],
                   logs_example=False)
    assert any("blob.csv" in e and "rejected as a whole" in e for e in texts(at.error)), texts(at.error)
    issues = next(d.value for d in at.dataframe if "reason" in d.value.columns)
    rejected = issues[issues["severity"] == "error"]
    assert {3, 4} <= set(rejected["row (line)"].dropna().astype(int))
    accepted = next(d.value for d in at.dataframe if "tok_per_s" in d.value.columns and "line" in d.value.columns)
    assert list(accepted["build"]) == ["b1"]  # the good row stays, nothing shifted


def test_bandwidth_page_shows_the_writeup_crosscheck(tiny_builds):
    at = open_page("app_pages/bandwidth.py")
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["A inferred, MB/token"] == "2,741.5"  # 55,900 / 20.39: exaone-repeat_kv-top8
    assert metrics["B inferred, MB/token"] == "1,029.5"  # 55,900 / 54.30: exaone-qfold-top8
    assert any("A = exaone-repeat_kv-top8 " in m for m in texts(at.markdown))
    assert metrics["inferred difference, MB/token"] == "1,712.1"
    assert metrics["graph difference, MB/token"] == "2,013.3"  # the shipped top8 A/B: 1,920 MiB of tile traffic
    assert at.warning or at.success  # a verdict sentence per fitted device
    captions = texts(at.caption)
    assert any("Assumed for exaone-qfold-top8" in c and "does not state it" in c for c in captions), captions


def test_export_page_offers_every_download(tiny_builds):
    at = open_page("app_pages/export.py")
    labels = [b.label for b in at.get("download_button")]
    for wanted in ("Download the HTML report", "analysis.json", "Op table (CSV)", "Bytes per token (CSV)",
                   "Bytes per layer (CSV)", "Tile ops (CSV)"):
        assert wanted in labels, labels


def test_export_page_offers_a_small_package_as_a_zip(tiny_builds):
    key = tiny_builds["qfold"].name
    at = open_page("app_pages/export.py", export_ref=f"build:{key}")
    labels = [b.label for b in at.get("download_button")]
    assert "Download the .mlpackage (zip)" in labels


# ---------------------------------------------------------------------------------------------- jobs
def test_build_job_reports_a_failed_conversion(monkeypatch, tmp_path):
    def failing(specs, root=None, on_progress=None, timeout_s=None):
        on_progress(jobs.Progress(0.2, "convert", "tracing"))
        raise BuildError(f"build {specs[0].key} failed: out of memory (log: x.log)")

    monkeypatch.setattr(jobs, "run_builds", failing)
    spec = BuildSpec(resolve_source("exaone-4.0-1.2b", ("num_hidden_layers=2",)), "qfold", "state", 64)
    job = jobs.BuildJob((spec,), tmp_path).start()
    job._thread.join(timeout=30)
    snap = job.snapshot()
    assert snap.state == "failed" and snap.finished
    assert "out of memory" in snap.error and snap.current_key == spec.key
    assert not any(tmp_path.iterdir())  # nothing left that looks like a build


# ---------------------------------------------------------------------------------------------- catalog
def test_shipped_files_follow_the_naming_convention(tmp_path):
    from analyzer.report.catalog import shipped_analyses, shipped_files

    for name in ("exaone-4.0-1.2b-repeat_kv-state-ctx4096.analysis.json",
                 "exaone-4.0-1.2b-qfold-state-ctx4096.analysis.json",
                 "llama-3.2-1b-qfold-input-ctx2048.analysis.json", "notes.analysis.json", "readme.md"):
        (tmp_path / name).write_text("{}")
    found = {(s.preset, s.variant, s.kv_mode, s.ctx) for s in shipped_files(tmp_path)}
    assert found == {("exaone-4.0-1.2b", "repeat_kv", "state", 4096), ("exaone-4.0-1.2b", "qfold", "state", 4096),
                     ("llama-3.2-1b", "qfold", "input", 2048)}
    assert set(shipped_analyses(tmp_path)) == {"repeat_kv", "qfold"}  # the default preset's only
    assert shipped_analyses(tmp_path / "missing") == {}


def test_default_pair_falls_back_to_matching_builds(tiny_builds):
    from analyzer.report.catalog import build_refs

    refs = build_refs()
    pair = default_pair(refs)  # no shipped refs given: the tiny builds
    assert pair is not None
    assert (pair[0].variant, pair[1].variant) == ("repeat_kv", "qfold")
    assert pair[0].spec == pair[1].spec
    assert default_pair([r for r in refs if r.variant == "qfold"]) is None


def test_default_log_mapping_by_build_key():
    from analyzer.report.catalog import AnalysisRef
    from analyzer.report.labels import default_log_mapping

    a = AnalysisRef("build:k-repeat", "build", "A", Path("/x/k-repeat"), "repeat_kv")
    b = AnalysisRef("build:k-qfold", "build", "B", Path("/x/k-qfold"), "qfold")
    mapping = default_log_mapping(["k-qfold", "exaone-qfold-top8", "top8-table", "repeat_kv-vs-qfold", "myqfold"],
                                  [a, b])
    # a build key maps to its build; refs without facts (no spec) are never guessed at
    assert mapping == {"k-qfold": b.id, "exaone-qfold-top8": None, "top8-table": None, "repeat_kv-vs-qfold": None,
                       "myqfold": None}
