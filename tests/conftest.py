"""Shared fixtures: real conversions, made once per test session in a temporary builds folder.

tiny: 2 layers of the default preset's attention geometry at ctx 256 (~10 s a build); tiny_phase_builds: the same
as decode+prefill packages.
coreai_builds: the tiny config as Core AI builds (materialised, fp16) of repeat_kv, qfold and sdpa_gqa.
structure: the default preset's 30 layers and attention geometry at ctx 4096 with small hidden/vocab sizes
(same tiles and tile bytes as full size: docs/measurements.md), in analysis mode (value-free weights: the same
analysis as a materialised build, op for op, tests/test_fast_identity.py; ~30 s a build where a materialised one
took ~2.5 min of the suite).

Tests marked ``full`` (full-size conversions, ~15 GB each) run only with ``QFOLD_FULL=1``; tests marked
``extended`` (the rest of a matrix whose representatives the default run keeps: every preset, every kind) only with
``QFOLD_EXTENDED=1``, so ``make test`` stays within 10 minutes on 2 cores.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from analyzer.convert.fork_client import stop_servers
from analyzer.convert.launch import run_builds
from analyzer.errors import SourceError
from analyzer.model.sources import DEFAULT_PRESET, STRUCTURE_OVERRIDES, geometry_of, load_config, resolve_source
from analyzer.model.spec import ANALYSIS_MODE, BuildSpec

TINY_OVERRIDES = (*STRUCTURE_OVERRIDES, "num_hidden_layers=2")
TINY_CTX = 256
# The fold report's keys, one document for both backends (analyzer.fold.fold_records.FoldReport.to_json); the fold
# CLI's --json adds input, output, the proof and, for a package, its cache entry.
FOLD_REPORT_KEYS = ("backend", "source", "pass", "pass_version", "changed", "tiles_found", "tiles_folded",
                    "tiles_left", "tiles", "functions", "weights", "composite_calls", "timings_s")
FULL_ENV = "QFOLD_FULL"
EXTENDED_ENV = "QFOLD_EXTENDED"


HEAVY_MARKS = ("conversion", "browser")


def representatives(values, keep) -> list:
    """``values`` as parameters, those not in ``keep`` marked ``extended`` (run with QFOLD_EXTENDED=1): the default
    run keeps one of each kind that differs, the extended run every one."""
    missing = set(keep) - set(values)
    assert not missing, f"representatives not among the values: {sorted(missing)}"
    return [v if v in keep else pytest.param(*(v if isinstance(v, tuple) else (v,)), marks=pytest.mark.extended)
            for v in values]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``full``-marked tests unless QFOLD_FULL=1 (they need ~15 GB and minutes per conversion). Then the
    files with conversion or browser tests go first. ``make test`` runs ``-n auto --dist loadfile
    --no-loadscope-reorder``: a test file's tests on one worker (each module fixture made once), files in this
    order, so the light files fill the end of the run instead of one worker finishing a long conversion alone.
    (``--dist loadgroup`` cannot group here: pytest 9 ignores the node id xdist 3.8 rewrites for it.)"""
    if os.environ.get(FULL_ENV) != "1":
        skip = pytest.mark.skip(reason=f"full-size conversions (~15 GB each): set {FULL_ENV}=1 to run")
        for item in items:
            if item.get_closest_marker("full") is not None:
                item.add_marker(skip)
    if os.environ.get(EXTENDED_ENV) != "1":
        skip = pytest.mark.skip(reason=f"the extended matrix (the default run keeps its representatives): set "
                                       f"{EXTENDED_ENV}=1 to run")
        for item in items:
            if item.get_closest_marker("extended") is not None:
                item.add_marker(skip)
    heavy = {item.path for item in items if any(item.get_closest_marker(m) for m in HEAVY_MARKS)}
    items.sort(key=lambda item: item.path not in heavy)  # stable: a file's tests stay together and in order


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, coremltools, transformers, Core AI, the analyzer: ~600,000 objects) lives
    for the whole run: out of the collector's sight, so a test's collections scan what the tests make. Every
    coremltools conversion ends in a gc.collect(), and conversion-heavy files spent ~30 % of their CPU collecting:
    test_fold_pass, test_families and test_fold_presets took 70.6 s of CPU with 22.0 s in the collector, 50.8 s
    with 4.2 s frozen."""
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Each test process reaps its fork server (``stop_servers``; an xdist worker may end without ``atexit``), so
    the run's CPU time includes the conversions forked by it."""
    stop_servers()


@pytest.fixture(scope="session")
def builds_root(tmp_path_factory, worker_id) -> Path:
    """One builds folder for the whole run, shared by every xdist worker: an identical conversion is made once
    (the builds folder's key locks make a second worker wait for it and reuse it, as two users would)."""
    base = tmp_path_factory.getbasetemp()
    root = (base if worker_id == "master" else base.parent) / "shared-builds"
    root.mkdir(exist_ok=True)
    os.environ["QFOLD_BUILDS"] = str(root)
    return root


def _built(specs: list[BuildSpec], root: Path) -> dict[str, Path]:
    """variant → build folder: the specs converted by ONE child, as the product converts an A/B (one process,
    one torch model, one equivalence check)."""
    return {s.variant: r.path for s, r in zip(specs, run_builds(specs, root), strict=True)}


def _pair(root: Path, overrides, ctx: int) -> dict[str, Path]:
    source = resolve_source(DEFAULT_PRESET, overrides)
    return _built([BuildSpec(source, v, "state", ctx) for v in ("repeat_kv", "qfold")], root)


@pytest.fixture(scope="session")
def tiny_builds(builds_root) -> dict[str, Path]:
    return _pair(builds_root, TINY_OVERRIDES, TINY_CTX)


@pytest.fixture(scope="session")
def tiny_analysis_builds(builds_root) -> dict[str, Path]:
    """The tiny pair as `build` makes it by default (analysis mode, one child): what a sweep point reuses."""
    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    return _built([BuildSpec(source, v, "state", TINY_CTX, build_mode=ANALYSIS_MODE) for v in ("repeat_kv", "qfold")],
                  builds_root)


TINY_Q_LEN = 64


@pytest.fixture(scope="session")
def tiny_phase_builds(builds_root) -> dict[str, Path]:
    """The tiny config as decode+prefill packages (two functions, shared weights; prefill of 64 tokens), per
    variant. Their decode equivalence check is the tiny pair's, reused from the cache."""
    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    return _built([BuildSpec(source, v, "state", TINY_CTX, phase="decode+prefill", q_len=TINY_Q_LEN)
                   for v in ("repeat_kv", "qfold")], builds_root)


@pytest.fixture(scope="session")
def structure_builds(builds_root) -> dict[str, Path]:
    """The structure pair, analysis mode, converted by one child (an A/B)."""
    source = resolve_source(DEFAULT_PRESET, STRUCTURE_OVERRIDES)
    return _built([BuildSpec(source, v, "state", 4096, build_mode=ANALYSIS_MODE) for v in ("repeat_kv", "qfold")],
                  builds_root)


@pytest.fixture(scope="session")
def shipped_styles(tmp_path_factory) -> dict[str, tuple]:
    """Each converter style of tests/shipped_styles.py (issue #20) saved with plain coremltools, folded
    (``fold_package``) and proved (``prove_fold``, no input spec, 4 steps): style → (package, folded package,
    fold report, proof), made once per session (the packages' folder holds nothing else)."""
    from analyzer.fold.coreml.package import fold_package
    from analyzer.fold.proof import prove_fold
    from tests.shipped_styles import STYLES

    root = tmp_path_factory.mktemp("shipped-styles")
    out = {}
    for name, build in STYLES.items():
        src = Path(build(root / f"{name}.mlpackage"))
        dst = root / f"{name}-folded.mlpackage"
        out[name] = (src, dst, fold_package(src, dst), prove_fold(src, dst, steps=4))
    return out


@pytest.fixture(scope="session")
def converted_corpus(tmp_path_factory) -> dict[str, tuple]:
    """Issue #37's corpus, made the way people make packages (tests/converted_styles.py: a tiny random transformers
    decoder traced and converted by plain coremltools along each converter's code path), each package folded
    (``fold_package``): name → (package, folded package, fold report). Names: ``STYLE-SHAPES-PRECISION`` for
    Apple's recipe (eager, SDPA) and HF's export with RangeDim or enumerated inputs, fp16 and int4 (enumerated int4
    for the HF export, the int4 one it ships), and ``form-FORM`` for each way a torch model copies K/V heads."""
    from analyzer.fold.coreml.package import fold_package
    from tests.converted_styles import FORMS, STYLES, convert, convert_form, quantize_int4

    root = tmp_path_factory.mktemp("converted")
    made: dict[str, Path] = {}
    for style in STYLES:
        for shapes in ("range", "enum"):
            fp16 = made[f"{style}-{shapes}-fp16"] = convert(style, shapes, root / f"{style}-{shapes}-fp16.mlpackage")
            if shapes == "range" or style == "hf_export":
                made[f"{style}-{shapes}-int4"] = quantize_int4(fp16, root / f"{style}-{shapes}-int4.mlpackage")
    for form in (*FORMS, "repeats_from_query"):
        made[f"form-{form}"] = convert_form(form, root / f"form-{form}.mlpackage")
    out = {}
    for name, src in made.items():
        dst = root / f"{name}-folded.mlpackage"
        shapes = {"hidden": (1, 2, 32), "mask": (1, 1, 2, 16)} if name == "form-repeats_from_query" else None
        out[name] = (src, dst, fold_package(src, dst, shapes=shapes))
    return out


# Every preset's 2-layer version, as test_families, test_interpret_presets, test_fold_presets and
# test_coreai_presets convert it (``preset_source``): the preset's own attention geometry (query heads, KV heads,
# head dim), a small MLP and vocabulary, and hidden 256 wherever the family's config takes a head_dim (the others,
# qwen2 and phi-3, derive it from the hidden size and so keep the preset's). What these tests assert (replication
# ops and their Hq·ctx·D bytes, the fold, the interpreter against torch) depends on the heads, not on the width of
# the residual stream; full-width 2-layer builds are tests/test_fast_identity.py's.
PRESET_SHRINK = ("num_hidden_layers=2", "intermediate_size=256", "vocab_size=512")
PRESET_HIDDEN = 256
PRESET_SEED = 3
PRESET_CTX = 128


def preset_source(preset: str, extra: tuple[str, ...] | list[str] = (), seed: int = PRESET_SEED):
    """The preset's 2-layer version (PRESET_SHRINK, hidden PRESET_HIDDEN where the config pins a head_dim) with
    ``extra`` overrides last; its heads, KV heads and head dim are the preset's own."""
    head_dim = geometry_of(load_config(resolve_source(preset))).head_dim
    try:
        return resolve_source(preset, [*PRESET_SHRINK, f"hidden_size={PRESET_HIDDEN}", f"head_dim={head_dim}",
                                       *extra], seed=seed)
    except SourceError:  # no head_dim field: head_dim = hidden / heads, so the hidden size stays the preset's
        return resolve_source(preset, [*PRESET_SHRINK, *extra], seed=seed)


@pytest.fixture(scope="session")
def preset_packages(builds_root):
    """``package(preset, variant, kv_mode="state") → .mlpackage``: the preset's 2-layer version (``preset_source``,
    seed 3) converted in-process at ctx 128, once per run: kept beside the shared builds folder under a lock per
    package, so the three modules reuse one conversion whichever worker runs them."""
    from filelock import FileLock

    from analyzer.convert.step import convert_step
    from analyzer.model.decode import DecodeStep, build_model

    root = builds_root.parent / "preset-packages"
    root.mkdir(exist_ok=True)
    last: dict[str, object] = {}  # the last preset's torch model (a model per preset would hold ~1 GB)

    def package(preset: str, variant: str, kv_mode: str = "state") -> Path:
        path = root / f"{preset}-{variant}-{kv_mode}.mlpackage"
        with FileLock(str(path) + ".lock"):
            if not path.is_dir():
                if preset not in last:
                    last.clear()
                    last[preset] = build_model(preset_source(preset))
                tmp = root / f".tmp-{os.getpid()}-{path.name}"
                convert_step(DecodeStep(last[preset], PRESET_CTX, variant, kv_mode).eval()).save(str(tmp))
                tmp.rename(path)
        return path

    return package


@pytest.fixture(scope="session")
def server(tiny_builds) -> Iterator[str]:
    """The dashboard (``streamlit run app.py``) on the session's builds folder, one per worker for every browser
    module: a server's first page views import the analyzer (~5-10 s of CPU each time a server starts). A module
    whose pages need other data starts its own (tests/test_bad_inputs_browser.py)."""
    from tests.test_browser import streamlit_server  # skips the browser modules where chromium is missing

    with streamlit_server(next(iter(tiny_builds.values())).parent) as url:
        yield url


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    """One headless chromium per worker, on a profile of its own (a ``BrowserContext``: Chromium's code cache is
    kept there, tests/test_browser.py ``chromium``); each test gets a page of its own (``page``, ``own_page``)."""
    from tests.test_browser import chromium

    with chromium(tmp_path_factory.mktemp("chromium-profile")) as profile:
        yield profile


@pytest.fixture
def page(browser):
    """A blank page of the test's own (nothing kept from another test's: storage and cookies are cleared when it
    closes); the test opens the page of the app it is about."""
    from tests.test_browser import own_page

    with own_page(browser) as pg:
        yield pg


COREAI_VARIANTS = ("repeat_kv", "qfold", "sdpa_gqa")


def coreai_specs() -> list[BuildSpec]:
    """The specs of ``coreai_builds``, for a module that requests them with its own builds in one child."""
    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    return [BuildSpec(source, v, "state", TINY_CTX, backend="coreai") for v in COREAI_VARIANTS]


@pytest.fixture(scope="session")
def coreai_builds(builds_root) -> dict[str, Path]:
    """The tiny config as Core AI builds (``--backend coreai``, materialised fp16: a ``model.aimodel`` each) of the
    three variants, converted by one child beside the Core ML tiny pair; skipped where Core AI is not installed."""
    pytest.importorskip("coreai_torch")  # Core AI's wheels: Linux x86_64 cp311/cp312 and macOS arm64 only
    return _built(coreai_specs(), builds_root)
