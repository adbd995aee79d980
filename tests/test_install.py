"""qfold as an installed tool: the wheel `pip install .` builds carries the `qfold` command and every data file the
code reads at run time, and the installed copy keeps its builds in the working directory, never in site-packages.

The wheel is unpacked beside the test's venv (its dependencies are the venv's), so the test costs a wheel build, not
a download; README's `pip install -r requirements.txt .` is the same wheel with the pinned requirements."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel of this checkout, unpacked as pip installs it into site-packages."""
    out = tmp_path_factory.mktemp("wheel")
    src = out / "src"  # a copy: setuptools writes build/ and *.egg-info beside the sources it builds
    shutil.copytree(REPO / "analyzer", src / "analyzer", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", src)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                    "-w", str(out), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = out.glob("qfold-*.whl")
    site = out / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


def _run(site: Path, cwd: Path, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("QFOLD_BUILDS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(site)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_the_wheel_declares_the_qfold_command_and_carries_every_data_file(installed):
    (entry_points,) = installed.glob("qfold-*.dist-info/entry_points.txt")
    assert "qfold = analyzer.cli:main" in entry_points.read_text()
    data = {p.relative_to(REPO).as_posix() for p in (REPO / "analyzer").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert data, "the core reads presets, shipped analyses and device profiles at run time"
    shipped = {p.relative_to(installed).as_posix() for p in (installed / "analyzer").rglob("*") if p.is_file()}
    assert data - shipped == set()


def test_installed_qfold_runs_from_another_directory_and_builds_there(installed, tmp_path):
    elsewhere = tmp_path / "work"
    elsewhere.mkdir()
    out = _run(installed, elsewhere, "import sys, analyzer\nfrom analyzer.cli import main\n"
               "from analyzer.convert.launch import builds_dir\n"
               "print(analyzer.__file__)\nprint(builds_dir())\nsys.exit(main(['presets']))")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert Path(lines[0]).is_relative_to(installed)  # the installed copy, not this checkout
    assert Path(lines[1]) == elsewhere / "builds"  # ./builds, never site-packages
    assert any(line.startswith("exaone-4.0-1.2b ") for line in lines)  # presets are package data


def _install_script():
    from importlib.machinery import SourceFileLoader
    from importlib.util import module_from_spec, spec_from_loader

    loader = SourceFileLoader("install_requirements", str(REPO / "scripts" / "install-requirements"))
    module = module_from_spec(spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def test_make_installs_with_uv_from_exactly_pips_sources_or_with_pip(monkeypatch, tmp_path):
    """scripts/install-requirements hands uv the indexes, find-links and constraints pip is configured with; an
    option it does not translate means pip."""
    script = _install_script()
    for key in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no configuration file: only the variables below
    monkeypatch.setenv("PIP_FIND_LINKS", "/wheels /more")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///idx/simple")
    monkeypatch.setenv("PIP_CONSTRAINT", "/c.txt")
    monkeypatch.setenv("PIP_CERT", "/ca.pem")
    monkeypatch.setenv("PIP_TIMEOUT", "60")
    options = script.pip_options()
    assert options == {"find-links": ["/wheels", "/more"], "constraint": ["/c.txt"], "cert": ["/ca.pem"],
                       "extra-index-url": ["file:///idx/simple"]}
    cmd = script.uv_command(options, ["-r", "requirements.txt"])
    assert cmd[cmd.index("uv"):][:3] == ["uv", "pip", "install"] and cmd[-2:] == ["-r", "requirements.txt"]
    flags = list(itertools.pairwise(cmd))
    assert {("--find-links", "/wheels"), ("--find-links", "/more"), ("--constraint", "/c.txt"),
            ("--extra-index-url", "file:///idx/simple"), ("--index-strategy", "unsafe-best-match")} <= set(flags)
    assert "/ca.pem" not in cmd  # (uv's SSL_CERT_FILE)
    monkeypatch.setenv("PIP_PREFER_BINARY", "1")
    assert script.pip_options() is None
