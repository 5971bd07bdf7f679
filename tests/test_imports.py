"""autoln's modules import one way only: ``lint-imports`` keeps pyproject.toml's contracts (the
layers in dependency order, and no circle), and a graph of every ``import`` statement in
autoln/*.py (those inside functions included) has no cycle. Both checks are shown to fail on a
copy of the package with a circle added. Also: ``dir(autoln)`` lists the lazily imported names."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import autoln

from .conftest import ROOT

PACKAGE = ROOT / "autoln"


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}`` for the flat package in ``package_dir``,
    from every ``import``/``from`` statement anywhere in each file (function bodies included).
    Modules are named by their file stem (``__init__`` for the package itself)."""
    name = package_dir.name
    modules = {p.stem for p in package_dir.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in sorted(package_dir.glob("*.py")):
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == name):
                base = (node.module or "") if node.level else (node.module or "").partition(".")[2]
                # `from . import x` and `from autoln import x` name modules; `from .x import y` names x
                targets = [f"{name}.{base}"] if base else [f"{name}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                head, _, rest = target.partition(".")
                if head != name:
                    continue
                module = rest.split(".")[0] if rest else "__init__"
                if module in modules and module != path.stem:
                    edges.add(module)
        graph[path.stem] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or None when it has none (depth-first,
    nodes and edges in sorted order, so the answer is deterministic)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def _copy_with_circle(tmp_path: Path) -> Path:
    """A copy of the repository's package and pyproject.toml under ``tmp_path`` in which
    tune_report imports tune inside a function (tune imports tune_report: a circle)."""
    shutil.copytree(PACKAGE, tmp_path / "autoln", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "autoln" / "tune_report.py", "a", encoding="utf-8") as fh:
        fh.write("\n\ndef _circle():\n    from .tune import run_tune\n")
    return tmp_path


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd)}  # grimp finds the package of cwd, not the installed one
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code, "--no-cache", "--no-logo"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def test_lint_imports_keeps_the_contracts():
    proc = _lint_imports(ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "2 kept, 0 broken" in proc.stdout


def test_lint_imports_fails_on_an_added_circle(tmp_path):
    proc = _lint_imports(_copy_with_circle(tmp_path))
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "autoln.tune.report is not allowed to import autoln.tune" in proc.stdout
    assert ".tune_report -> .tune" in proc.stdout  # the acyclic contract's cycle breaker


def test_the_import_graph_of_autoln_has_no_cycle():
    graph = import_graph(PACKAGE)
    assert {"compare", "run_retrain", "runs", "tune", "tune_report"} <= set(graph)
    assert "run_retrain" in graph["compare"] and "runs" in graph["run_retrain"]  # function-level imports are edges
    assert find_cycle(graph) is None, f"import circle: {' -> '.join(find_cycle(graph))}"


def test_the_graph_check_finds_an_added_circle(tmp_path):
    graph = import_graph(_copy_with_circle(tmp_path) / "autoln")
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert {"tune", "tune_report"} <= set(cycle)


def test_find_cycle_on_small_graphs():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None  # a diamond is no cycle
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"x": set(), "a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]


def test_import_graph_reads_every_form_of_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\nimport pkg.c\n\ndef f():\n    from .d import x\n    from pkg import e\n")
    for name in "bcde":
        (pkg / f"{name}.py").write_text("import os\nfrom os import path\n")
    (pkg / "e.py").write_text("import pkg\n")
    graph = import_graph(pkg)
    assert graph["a"] == {"b", "c", "d", "e"} and graph["b"] == set() and graph["e"] == {"__init__"}


def test_dir_lists_the_lazily_imported_public_names():
    names = dir(autoln)
    assert set(autoln.__all__) <= set(names)
    assert {"__version__", "__getattr__"} <= set(names) and names == sorted(names)


def test_every_function_of_the_package_fits_on_a_hundred_lines():
    """Small functions with one job each: none of autoln's functions (the search and retrain
    path, the API's ``search``, ``compare_genotypes`` and ``race_genotypes`` among them) runs over
    100 lines, docstring included."""
    import ast

    long = []
    for path in sorted((ROOT / "autoln").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - first + 1 > 100:
                    long.append(f"{path.name}:{node.name} ({node.end_lineno - first + 1} lines)")
    assert not long, long
