"""Shared fixtures: real conversions, made once per test session in a temporary builds folder.

tiny: 2 layers of the default preset's attention geometry at ctx 256 (~10 s a build); tiny_phase_builds: the same
as decode+prefill packages.
structure: the default preset's 30 layers and attention geometry at ctx 4096 with small hidden/vocab sizes
(same tiles and tile bytes as full size in ~1 min and ~1 GB a build: docs/measurements.md).

Tests marked ``full`` (full-size conversions, ~15 GB each) run only with ``QFOLD_FULL=1``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from analyzer.build.builds import BuildSpec, run_build
from analyzer.model.sources import DEFAULT_PRESET, STRUCTURE_OVERRIDES, resolve_source

TINY_OVERRIDES = (*STRUCTURE_OVERRIDES, "num_hidden_layers=2")
TINY_CTX = 256
FULL_ENV = "QFOLD_FULL"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``full``-marked tests unless QFOLD_FULL=1 (they need ~15 GB and minutes per conversion)."""
    if os.environ.get(FULL_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"full-size conversions (~15 GB each): set {FULL_ENV}=1 to run")
    for item in items:
        if item.get_closest_marker("full") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def builds_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("builds")
    os.environ["QFOLD_BUILDS"] = str(root)
    return root


def _pair(root: Path, overrides, ctx: int) -> dict[str, Path]:
    source = resolve_source(DEFAULT_PRESET, overrides)
    return {v: run_build(BuildSpec(source, v, "state", ctx), root).path for v in ("repeat_kv", "qfold")}


@pytest.fixture(scope="session")
def tiny_builds(builds_root) -> dict[str, Path]:
    return _pair(builds_root, TINY_OVERRIDES, TINY_CTX)


TINY_Q_LEN = 64


@pytest.fixture(scope="session")
def tiny_phase_builds(builds_root) -> dict[str, Path]:
    """The tiny config as decode+prefill packages (two functions, shared weights; prefill of 64 tokens), per
    variant. Their decode equivalence check is the tiny pair's, reused from the cache."""
    source = resolve_source(DEFAULT_PRESET, TINY_OVERRIDES)
    return {v: run_build(BuildSpec(source, v, "state", TINY_CTX, phase="decode+prefill", q_len=TINY_Q_LEN),
                         builds_root).path for v in ("repeat_kv", "qfold")}


@pytest.fixture(scope="session")
def structure_builds(builds_root) -> dict[str, Path]:
    return _pair(builds_root, STRUCTURE_OVERRIDES, 4096)
