"""House rules that a grep, an import or a parse can check: the core never imports streamlit, nothing unpickles or
runs remote code, every import (lazy ones inside functions included) follows the layering the README states and
makes no circle, the README's layout table is the tree, and no module grows past the README's hard size limit (its
guide is ~400 lines for a module that does one job; the test holds the hard limit only)."""

import ast
import functools
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import analyzer
from app_pages.session_keys import Key

REPO = Path(__file__).resolve().parent.parent
CODE = [*REPO.glob("analyzer/**/*.py"), REPO / "app.py", *REPO.glob("app_pages/*.py"), *REPO.glob("bench/*.py")]
# The product's modules: the core, the dashboard. Every house rule below covers both.
PRODUCT = sorted([*REPO.glob("analyzer/**/*.py"), REPO / "app.py", *REPO.glob("app_pages/**/*.py")])
README = (REPO / "README.md").read_text()
_SIZE = re.search(r"no module of the product passes (\d+) lines", README)
assert _SIZE, "the README no longer states the module size limit this file checks"
MAX_MODULE_LINES = int(_SIZE.group(1))  # the hard limit; ~400 lines is the README's guide, not a test
# The dashboard's pages (app.py's st.Page entries); the other app_pages modules are what pages share.
PAGES = set(re.findall(r'st\.Page\("app_pages/(\w+)\.py"', (REPO / "app.py").read_text()))
# Modules over the hard limit that another branch is splitting; each must still be over it (else drop it from here).
OVER_LIMIT_UNTIL_SPLIT: dict[str, str] = {}


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


# ---------------------------------------------------------------------------------------------- imports
def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in REPO.glob("analyzer/**/*.py")}


def _resolve(name: str) -> str | None:
    """The analyzer module an import names (a submodule when ``from package import submodule``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(path: Path) -> set[str]:
    """Every analyzer module ``path`` imports, at module level or inside a function, type-only ones too."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            if t.split(".")[0] == "analyzer" and (resolved := _resolve(t)) is not None and resolved != me:
                out.add(resolved)
    return out


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module → the analyzer modules it imports (parsed when a test asks, not when the suite is collected)."""
    return {name: imports_of(path) for name, path in MODULES.items()}


def _layering() -> tuple[list[str], set[str]]:
    """The package order and the base modules, as the README states them."""
    order = re.search(r"`(model(?: → \w+)+)`", README)
    base = re.search(r"base modules ((?:`\w+`(?:, | and )?)+) are usable by all", README)
    assert order and base, "the README no longer states the layering this test checks"
    return order.group(1).split(" → "), set(re.findall(r"`(\w+)`", base.group(1)))


def _layer(module: str, order: list[str], base: set[str]) -> str:
    parts = module.split(".")
    if module in ("analyzer", "analyzer.__main__"):
        return "cli" if module.endswith("__main__") else "base"
    if len(parts) == 2 and parts[1] in base:
        return "base"
    assert parts[1] in order, f"{module} is in no layer the README names"
    return parts[1]


def test_imports_follow_the_readme_layering():
    order, base = _layering()
    assert order == ["model", "ir", "engines", "analysis", "compare", "convert", "fold", "measure", "predict", "sweep",
                     "report", "cli"]
    assert base == {"errors", "fmt", "fsio", "jsonfields"}
    wrong = []
    for module, targets in import_graph().items():
        mine = _layer(module, order, base)
        for target in targets:
            theirs = _layer(target, order, base)
            if theirs == "base":
                continue
            if mine == "base" or order.index(theirs) > order.index(mine):
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert wrong == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_lazy_imports_included():
    assert _cycles(import_graph()) == []


def test_the_import_checks_can_fail():
    """The two checks above on made-up graphs: a circle through a lazy import, a lower layer importing a higher."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    order, base = _layering()
    assert order.index(_layer("analyzer.report.catalog", order, base)) > order.index(
        _layer("analyzer.analysis.record", order, base))
    assert "analyzer.ir.coreml.mil_reader" in import_graph()["analyzer.analysis.record"]  # edges are found
    assert "analyzer.model.compress_spec" in import_graph()["analyzer.model.spec"]


# ---------------------------------------------------------------------------------------------- the tree
def _layout_rows() -> dict[str, set[str]]:
    """README layout table: ``analyzer/<package>/`` → the names in backticks on its row."""
    rows = {}
    for line in README.splitlines():
        m = re.match(r"\| `(analyzer/\w+/)` \| (.*) \|$", line)
        if m:
            rows[m.group(1)] = set(re.findall(r"`([\w/]+)`", m.group(2)))
    return rows


def test_readme_layout_table_matches_the_tree():
    rows = {k: v for k, v in _layout_rows().items() if (REPO / k / "__init__.py").is_file()}
    packages = {f"{p.relative_to(REPO)}/" for p in (REPO / "analyzer").iterdir()
                if p.is_dir() and (p / "__init__.py").is_file()}
    assert set(rows) == packages
    for package, names in rows.items():
        folder = REPO / package
        modules = {p.stem for p in folder.glob("*.py")} | {f"{p.name}/" for p in folder.iterdir() if p.is_dir()
                                                           and not p.name.startswith("__")}
        for sub in (p for p in folder.iterdir() if (p / "__init__.py").is_file()):
            modules |= {p.stem for p in sub.glob("*.py") if p.stem != "__init__"}
        missing = {m for m in modules if m != "__init__" and m not in names}
        assert not missing, f"{package}: modules not in the README layout table: {sorted(missing)}"
        unknown = {n for n in names if n.rstrip("/") not in {m.rstrip("/") for m in modules} and n != "__init__"}
        assert not unknown, f"{package}: the README layout table names what is not there: {sorted(unknown)}"
    for line in ("`analyzer/errors.py`, `fmt.py`, `fsio.py`, `jsonfields.py`", "`analyzer/shipped/`"):
        assert line in README
    assert {p.name for p in (REPO / "analyzer").glob("*.py")} == {"__init__.py", "__main__.py", "errors.py",
                                                                 "fmt.py", "fsio.py", "jsonfields.py"}


def test_no_module_over_the_limit():
    """The hard limit (the README's): a module past it does more than one job. Under it, size is a guide."""
    assert 400 < MAX_MODULE_LINES <= 1000  # the README's number, read: neither the guide itself nor no limit at all
    over = {str(p.relative_to(REPO)): n for p in PRODUCT if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert set(over) == set(OVER_LIMIT_UNTIL_SPLIT), over


# ------------------------------------------------------------------------------------------ one name, one place
def duplicate_base_names(paths: list[Path]) -> dict[str, list[str]]:
    """Module base names used more than once, outside cli/ (one module per subcommand, named after it) and the
    interpreter's per-op kernels (interpret/ops/, named after the op families)."""
    seen: dict[str, list[str]] = {}
    for p in paths:
        rel = p.relative_to(REPO).as_posix()
        if p.name == "__init__.py" or rel.startswith("analyzer/cli/") or "/interpret/ops/" in rel:
            continue
        seen.setdefault(p.stem, []).append(rel)
    return {name: where for name, where in seen.items() if len(where) > 1}


def test_no_two_modules_share_a_base_name():
    assert duplicate_base_names(PRODUCT) == {}
    assert duplicate_base_names([REPO / "analyzer/analysis/record.py", REPO / "app_pages/record.py"]) == {
        "record": ["analyzer/analysis/record.py", "app_pages/record.py"]}


# ------------------------------------------------------------------------------------------ imports at the top
# Heavy or optional dependencies: imported inside functions, and only in the boundary modules the README lists.
LAZY_ALLOWED = {"torch", "coremltools", "ray", "transformers", "coreai", "coreai_torch", "model_explorer",
                "coreai_opt"}


def lazy_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import statement not at the module's top: inside a function, a ``with``, an ``if``
    or a loop (an ``if TYPE_CHECKING:`` block at the top is a declaration, not an import)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top = {id(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    for block in (n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)):
        top |= {id(n) for n in ast.walk(block)}
    out = []
    for n in ast.walk(tree):
        if id(n) in top:
            continue
        if isinstance(n, ast.Import):
            out += [(n.lineno, a.name) for a in n.names]
        elif isinstance(n, ast.ImportFrom):
            out.append((n.lineno, n.module or "."))
    return sorted(out)


def heavy_at_import(path: Path) -> bool:
    """A module that imports a heavy dependency at its top (a coremltools pass is a coremltools class): importing it
    is importing that dependency, so it too is imported lazily, where it is used."""
    tree = ast.parse(path.read_text(), filename=str(path))
    tops = [a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names] + \
        [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module]
    return any(m.split(".")[0] in LAZY_ALLOWED for m in tops)


@functools.cache
def heavy_modules() -> set[str]:
    return {name for name, path in MODULES.items() if heavy_at_import(path)}


def _boundary_modules() -> set[str]:
    m = re.search(r"boundary modules, the only ones that import inside a function: ((?:`[\w./]+`(?:, | and )?)+)",
                  README)
    assert m, "the README no longer lists the boundary modules"
    return set(re.findall(r"`([\w./]+)`", m.group(1)))


def test_imports_are_at_module_top_except_heavy_ones_at_boundaries():
    boundary = _boundary_modules()
    wrong, lazy_modules = [], set()
    for path in PRODUCT:
        rel = path.relative_to(REPO).as_posix()
        me = _module_name(path) if rel.startswith("analyzer/") else None
        for line, module in lazy_imports(path):
            heavy = module.split(".")[0] in LAZY_ALLOWED or module in heavy_modules()
            if heavy or (me and module == me):  # a worker imports itself by name
                lazy_modules.add(rel)
            else:
                wrong.append(f"{rel}:{line} imports {module} inside a function")
    assert wrong == []
    assert lazy_modules == boundary, "README boundary list vs the modules that import lazily"


def test_the_lazy_import_check_can_fail(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef g():\n    import json\n    from torch import nn\n    return json, nn, os\n"
                 "with open(os.devnull):\n    import re\nif os.sep:\n    import csv\n")
    assert lazy_imports(f) == [(4, "json"), (5, "torch"), (8, "re"), (10, "csv")]
    # the fold pass (a coremltools class) is heavy; the records its reports share are not
    assert "analyzer.fold.coreml.gqa_fold" in heavy_modules()
    assert "analyzer.fold.fold_records" not in heavy_modules()


# ---------------------------------------------------------------------------------------------- the dashboard
def _app_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_the_dashboard_is_a_layer_above_the_core():
    """app.py and app_pages/ import the core and Streamlit; the core never imports them (app_pages is the top)."""
    for path in REPO.glob("analyzer/**/*.py"):
        assert not {m for m in _app_imports(path) if m.split(".")[0] in ("app_pages", "app")}, path
    pages = {p.stem for p in REPO.glob("app_pages/*.py")}
    for path in REPO.glob("app_pages/*.py"):
        # a page never imports another page: what two pages share lives in a non-page module or in analyzer/
        imported = {m.split(".")[1] for m in _app_imports(path) if m.startswith("app_pages.")}
        assert not (imported & PAGES), f"{path.name} imports page(s) {imported & PAGES}"
    assert PAGES <= pages


def test_shared_session_keys_are_named_not_spelled():
    """A key of ``app_pages.session_keys.Key`` is written ``Key.X`` wherever it is used (a misspelt literal would be
    a silently empty value)."""
    spelled = [f"{p.relative_to(REPO)}: {k.value!r}" for p in sorted((REPO / "app_pages").glob("*.py"))
               if p.name != "session_keys.py" for k in Key
               if re.search(rf"""["']{re.escape(k.value)}["']""", p.read_text())]
    assert spelled == []


# ------------------------------------------------------------------------------------- scripts outside the core
def _defined_names(path: Path) -> set[str]:
    """What a module defines or imports at any depth (a static read: importing bench scripts' targets costs torch)."""
    out = set()
    for n in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.Assign, ast.AnnAssign)):
            out |= {x.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                    for x in ast.walk(t) if isinstance(x, ast.Name)}
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            out |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return out


def test_bench_and_scripts_import_what_the_core_still_has():
    """bench/ and scripts/ run on demand, not in this suite: a rename in the core must not leave them importing a
    name that is gone (bench/fold_full_size.py imported load_program for months after it went)."""
    missing = []
    for path in sorted([*REPO.glob("bench/*.py"), *REPO.glob("scripts/**/*.py")]):
        for n in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(n, ast.ImportFrom) and n.level == 0 and (n.module or "").startswith("analyzer")):
                continue
            target = MODULES.get(n.module)
            if target is None:
                missing.append(f"{path.relative_to(REPO)}:{n.lineno}: no module {n.module}")
                continue
            have = _defined_names(target)
            missing += [f"{path.relative_to(REPO)}:{n.lineno}: {n.module} has no {a.name}" for a in n.names
                        if a.name not in have and f"{n.module}.{a.name}" not in MODULES]
    assert missing == []
