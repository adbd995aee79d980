"""Every third-party module the code imports is pinned in requirements*.txt.

CI installs only what the requirement files name on a fresh machine; a module that happens to be in a
developer's venv (humanize once was) fails collection there and nowhere else.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the project's own top-level names, and the sibling modules bench scripts and the macOS companion import by name
LOCAL = {"analyzer", "app_pages", "tests", "bench", "scripts", "app",
         *(p.stem for p in ROOT.glob("bench/*.py")), *(p.stem for p in ROOT.glob("scripts/**/*.py"))}
SOURCES = ("analyzer", "app_pages", "tests", "bench", "scripts")


def _imported_top_levels() -> dict[str, str]:
    found: dict[str, str] = {}
    files = [ROOT / "app.py"] + [p for d in SOURCES for p in (ROOT / d).rglob("*.py")]
    for path in files:
        if ".venv" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in LOCAL and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def _pinned() -> set[str]:
    names: set[str] = set()
    for req in ROOT.glob("requirements*.txt"):
        for line in req.read_text().splitlines():
            match = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[[A-Za-z0-9_,.\- ]*\])?\s*==", line)  # name[extras]==
            if match:
                names.add(re.sub(r"[-_.]+", "-", match.group(1)).lower())
    return names


def test_every_third_party_import_is_pinned():
    dists = metadata.packages_distributions()
    pinned = _pinned()
    missing = []
    for module, where in sorted(_imported_top_levels().items()):
        candidates = {re.sub(r"[-_.]+", "-", d).lower() for d in dists.get(module, [module])}
        if not candidates & pinned:
            missing.append(f"{module} (imported in {where}; distributions {sorted(candidates)})")
    assert not missing, "imported but not pinned in requirements*.txt: " + "; ".join(missing)


def test_the_check_sees_real_imports():
    found = _imported_top_levels()
    # The check must find the core's own dependencies, or it proves nothing.
    for module in ("coremltools", "numpy", "torch", "streamlit", "humanize"):
        assert module in found
