"""House rules that a grep and an import can check: the core never imports streamlit, nothing unpickles
or runs remote code."""

import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import analyzer

REPO = Path(__file__).resolve().parent.parent
CODE = [*REPO.glob("analyzer/**/*.py"), REPO / "app.py", *REPO.glob("app_pages/*.py"), *REPO.glob("bench/*.py")]


def test_analyzer_never_imports_streamlit():
    modules = [m.name for m in pkgutil.walk_packages(analyzer.__path__, "analyzer.") if m.name != "analyzer.__main__"]
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules) + \
        "print('streamlit' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
    for path in REPO.glob("analyzer/**/*.py"):
        assert not re.search(r"^\s*(import|from)\s+streamlit", path.read_text(), re.M), path


def test_no_unpickling_and_no_remote_code():
    banned = re.compile(r"torch\.load\(|pickle\.loads?\(|trust_remote_code\s*=\s*True"
                        r"|(?<![.\w])eval\(|(?<![.\w])exec\(")
    for path in CODE:
        assert not banned.search(path.read_text()), path
