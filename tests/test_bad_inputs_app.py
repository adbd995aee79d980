"""Issue #24 on the dashboard (AppTest): link text is shown as text, never as markdown; a bad path typed into a
field, "Fold it" with a missing input spec and one corrupt build folder each give a message where they occur,
and no page raises."""

from __future__ import annotations

import json
import os
import re

import pytest
from streamlit.testing.v1 import AppTest

from tests.bad_input_packages import gqa_package
from tests.test_app import new_app

PAYLOADS = {"a": "![x](http://198.51.100.7/x.png)", "b": "[Session expired: sign in again](http://198.51.100.7/phish)"}
PAGES = ["app_pages/ab.py", "app_pages/builds.py", "app_pages/device_logs.py", "app_pages/bandwidth.py",
         "app_pages/sweeps.py", "app_pages/export.py"]
# A device name from an uploaded log, and a package whose folder path is a link once its parts are joined by "/".
DEVICE = "[Session expired: sign in again](http://198.51.100.7/phish) <img src=x onerror=alert(1)>"
PACKAGE_PARENT = ("[Session expired](http:", "198.51.100.7", "phish)")
PACKAGE_NAME = "**pkg** <img src=x onerror=alert(1)>.mlpackage"
# Two builds the log labels map to the shipped top8 pair, so the fitted bandwidth is "fitted on DEVICE", and one
# whose label maps to nothing by itself; the quantization is a markdown image.
BUILD = "[b](http://198.51.100.7/b) <img src=x onerror=alert(2)>"
PAYLOAD_LOG = ("device,build,tok_per_s,context_length,quantization\n"
               + "".join(f'"{DEVICE}","{build}",{rate},4096,"![x](http://198.51.100.7/x.png)"\n'
                         for build, rate in (("exaone-repeat_kv-top8", 20.39), ("exaone-qfold-top8", 54.30),
                                             (BUILD, 30.0)))).encode()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A builds folder holding one corrupt build (and nothing else), and a data root with a package, a symbolic
    link loop and no input spec."""
    root = tmp_path_factory.mktemp("bad-app")
    builds = root / "builds"
    corrupt = builds / "corrupt-build-0123456789"
    corrupt.mkdir(parents=True)
    (corrupt / "analysis.json").write_text('{"schema_version": 2, "program": ' + "9" * 5000 + "}")
    (root / "data").mkdir()
    gqa_package(root / "data" / "gqa.mlpackage")
    (root / "data" / "loop.mlpackage").symlink_to(root / "data" / "loop.mlpackage")
    parent = root.joinpath("data", *PACKAGE_PARENT)
    parent.mkdir(parents=True)
    os.rename(gqa_package(root / "data" / "named.mlpackage"), parent / PACKAGE_NAME)
    return root


@pytest.fixture
def env(data, monkeypatch):
    monkeypatch.setenv("QFOLD_BUILDS", str(data / "builds"))
    monkeypatch.setenv("QFOLD_DATA_ROOTS", str(data / "data"))
    return data


def _app(page: str | None = None, **query) -> AppTest:
    """The app with ``query`` in its URL, on ``page`` (first run, as tests/test_app.open_page) or the default one."""
    at = new_app(120)
    at.query_params.update(query)
    if page is not None:
        at.switch_page(page)
    at.run()
    return at


def _all_markdown(at: AppTest) -> list[str]:
    return [str(e.value) for group in (at.markdown, at.caption, at.warning, at.error, at.info, at.success)
            for e in group]


def test_link_text_is_shown_as_text_on_every_page(env):
    at = _app(**PAYLOADS)
    for page in PAGES:
        at.switch_page(page)
        at.run()
        assert not at.exception, (page, [e.value for e in at.exception])
        for text in _all_markdown(at):
            for payload in PAYLOADS.values():  # present only inside a code span: never a link or an image
                if payload in text:
                    assert f"` {payload} `" in text, (page, text)
    at.switch_page("app_pages/ab.py")
    warnings = " ".join(str(w.value) for w in _app(**PAYLOADS).warning)
    assert "is not among the analyses on this server" in warnings and f"` {PAYLOADS['a']} `" in warnings, warnings


def _protos(node, out: list) -> list:
    """Every element's protobuf under ``node`` with its type."""
    if getattr(node, "proto", None) is not None:
        out.append((node.type, node.proto))
    for child in getattr(node, "children", {}).values():
        _protos(child, out)
    return out


MARKDOWN_FIELDS = ("body", "label", "help")  # what Streamlit renders as markdown (a radio's options too)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
LIVE_MARKUP = re.compile(r"(?<!\\)<[a-z]|(?<!\\)\]\(|\*\*pkg")  # a tag, a link or image target, bold


def _strings(doc) -> list[str]:
    if isinstance(doc, str):
        return [doc]
    items = doc.values() if isinstance(doc, dict) else doc if isinstance(doc, list) else ()
    return [t for item in items for t in _strings(item)]


def assert_user_text_is_text(at: AppTest, where: str) -> int:
    """Every markdown surface (bodies, labels, tooltips, radio options) that holds the device or package payload
    holds it only as escaped text or inside a code span; a chart holds it with ``<`` as an entity (plotly renders
    tags). Returns how many surfaces held it."""
    seen = 0
    for kind, proto in _protos(at.main, []):
        if kind == "plotly_chart":
            hits = [t for t in _strings(json.loads(proto.spec)) if "198.51.100.7" in t or "onerror" in t]
            assert all("<img" not in t and "<a" not in t for t in hits), (where, hits)
            seen += bool(hits)
            continue
        fields = [*MARKDOWN_FIELDS, *(("options",) if kind == "radio" else ())]
        for name in fields:
            values = getattr(proto, name, None) if name in proto.DESCRIPTOR.fields_by_name else None
            for text in [values] if isinstance(values, str) else list(values or ()):
                if "198.51.100.7" in text or "onerror" in text:
                    seen += 1
                    assert not LIVE_MARKUP.search(CODE_SPAN.sub("", text)), (where, kind, name, text)
    return seen


def test_device_and_package_names_are_text_on_every_page(env):
    """A log's device name and a package's name and folder (markdown and HTML in both) reach the A/B caption and
    headline tooltip, the Bandwidth page, the Export page's report list and the Device logs mapping as text."""
    package = str(env.joinpath("data", *PACKAGE_PARENT, PACKAGE_NAME).resolve())
    held = {}
    for query in ({"bw": "fitted"}, {"bw": "fitted", "pkg": package, "b": f"package:{package}"}):
        at = new_app(120)
        at.query_params.update(query)
        at.session_state["logs_files"] = [("log.csv", PAYLOAD_LOG)]
        if "pkg" in query:  # mapped by hand to the package: "Mapped by you (by its label: why not)"
            at.session_state["logs_mapping"] = {BUILD: f"package:{package}"}
        at.run()
        for page in ("app_pages/ab.py", "app_pages/bandwidth.py", "app_pages/export.py", "app_pages/device_logs.py"):
            at.switch_page(page)
            at.run()
            assert not at.exception, (page, [e.value for e in at.exception])
            held[(page, "pkg" in query)] = assert_user_text_is_text(at, page)
            if page == "app_pages/ab.py" and "pkg" not in query:  # the measured pair: its card names the device
                assert any(f"` {DEVICE} `" in m.proto.help for m in at.metric), [m.proto.help for m in at.metric]
    assert all(held.values()), held  # every page showed the payload somewhere (so the check checked something)


def test_one_corrupt_build_folder_is_listed_as_unreadable_and_the_rest_works(env):
    at = _app("app_pages/builds.py")
    assert not at.exception, [e.value for e in at.exception]
    unreadable = [str(w.value) for w in at.warning if "Unreadable build folder" in str(w.value)]
    assert len(unreadable) == 1 and "corrupt-build-0123456789" in unreadable[0] and "5\\,000 digits" in unreadable[0]
    at.switch_page("app_pages/ab.py")
    at.run()
    assert not at.exception and at.metric  # the shipped pair still opens


@pytest.mark.parametrize("typed, message", [
    ("~nosuchuser/model.mlpackage", "cannot resolve it"),
    ("LOOP", "cannot resolve it"),
])
def test_a_bad_package_path_is_a_message_not_a_crash(env, typed, message):
    at = _app("app_pages/builds.py")
    at.text_input(key="builds_package_path").set_value(typed.replace("LOOP", str(env / "data" / "loop.mlpackage")))
    next(b for b in at.button if b.label == "Analyse").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any(message in str(e.value) for e in at.error), [e.value for e in at.error]


@pytest.mark.parametrize("typed", ["~nosuchuser/model", "LOOP"])
def test_a_bad_config_folder_is_a_message_not_a_crash(env, typed):
    at = _app("app_pages/builds.py")
    at.radio(key="builds_source_kind").set_value("Local model folder")
    at.run()
    at.text_input(key="builds_folder").set_value(typed.replace("LOOP", str(env / "data" / "loop.mlpackage")))
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("cannot resolve it" in str(e.value) for e in at.error), [e.value for e in at.error]


def test_fold_it_with_a_missing_input_spec_is_a_message(env):
    package = str((env / "data" / "gqa.mlpackage").resolve())
    at = new_app(120)
    at.session_state["builds_packages"] = [package]
    at.switch_page("app_pages/builds.py")
    at.run()
    at.selectbox(key="builds_fold_pick").set_value(package)
    at.text_input(key="builds_fold_spec").set_value(str(env / "data" / "no-such-spec.json"))
    next(b for b in at.button if b.label == "Fold it").click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("no\\-such\\-spec\\.json" in str(e.value) and "No such file" in str(e.value) for e in at.error), \
        [e.value for e in at.error]
    assert json.loads((env / "data" / "gqa.mlpackage" / "Manifest.json").read_text())  # the input is untouched


def test_a_builds_folder_that_is_a_file_is_one_message(env, monkeypatch):
    monkeypatch.setenv("QFOLD_BUILDS", str(env / "data" / "gqa.mlpackage" / "Manifest.json"))
    at = _app()
    assert not at.exception, [e.value for e in at.exception]
    assert any("the builds folder is not a folder" in str(e.value).replace("\\", "") for e in at.error)
