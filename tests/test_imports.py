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


def module_names(package_dir: Path) -> dict[str, Path]:
    """``{dotted name relative to the package: file}`` for every module of the package in
    ``package_dir``, folders included (a folder is named by its ``__init__.py``, the package
    itself ``__init__``), e.g. ``tune.report``, ``tune``, ``__init__``."""
    names = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts) or "__init__"] = path
    return names


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}`` for the package in ``package_dir`` (its
    folders included, modules named as :func:`module_names` names them), from every
    ``import``/``from`` statement anywhere in each file (function bodies included). ``from X
    import y`` is an edge to ``X.y`` when that is a module (``from autoln.core import io``), else
    to ``X`` (``from autoln.config import Config``: the folder's ``__init__``)."""
    name = package_dir.name
    modules = module_names(package_dir)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        own = [] if module == "__init__" else module.split(".")
        here = own if path.name == "__init__.py" else own[:-1]  # the package a relative import starts from
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [".".join(a.name.split(".")[1:]) for a in node.names if a.name.split(".")[0] == name]
            elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == name):
                if node.level:
                    base = here[:len(here) - node.level + 1] + (node.module.split(".") if node.module else [])
                else:
                    base = node.module.split(".")[1:]
                targets = []
                for alias in node.names:
                    sub = ".".join(base + [alias.name])
                    targets.append(sub if sub in modules else ".".join(base))
            else:
                continue
            edges |= {t or "__init__" for t in targets if (t or "__init__") in modules and (t or "__init__") != module}
        graph[module] = edges
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
    ``race/rule.py`` imports ``race/run_race.py`` inside a function (run_race imports rule: a circle
    inside a folder) and ``core/io.py`` imports ``race/rule.py`` (the lowest layer imports upwards)."""
    shutil.copytree(PACKAGE, tmp_path / "autoln", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "autoln" / "race" / "rule.py", "a", encoding="utf-8") as fh:
        fh.write("\n\ndef _circle():\n    from autoln.race.run_race import run_race\n")
    with open(tmp_path / "autoln" / "core" / "io.py", "a", encoding="utf-8") as fh:  # a layer imports upwards
        fh.write("\n\ndef _upwards():\n    from autoln.race.rule import REVISION\n")
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
    assert "autoln.core.io -> autoln.race.rule" in proc.stdout  # the layers contract names the import
    assert "No cycles are allowed in autoln.race." in proc.stdout  # the acyclic contract names one edge of the circle
    assert ".run_race -> .rule" in proc.stdout or ".rule -> .run_race" in proc.stdout


def test_the_import_graph_of_autoln_has_no_cycle():
    graph = import_graph(PACKAGE)
    assert {"retrain.compare", "retrain.run_retrain", "engine.folders", "tune", "race.rule", "__init__"} <= set(graph)
    # function-level imports are edges; `from autoln.core import distributed` names the module
    assert "retrain.run_retrain" in graph["retrain.compare"] and "engine.folders" in graph["retrain.run_retrain"]
    assert "core.distributed" in graph["retrain.run_retrain"] and "config" in graph["retrain.run_retrain"]
    assert find_cycle(graph) is None, f"import circle: {' -> '.join(find_cycle(graph))}"


def test_the_graph_check_finds_an_added_circle(tmp_path):
    graph = import_graph(_copy_with_circle(tmp_path) / "autoln")
    cycle = find_cycle(graph)
    assert cycle is not None and cycle[0] == cycle[-1]
    assert {"race.rule", "race.run_race"} <= set(cycle)


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
    for path in sorted((ROOT / "autoln").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                if node.end_lineno - first + 1 > 100:
                    long.append(f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - first + 1} lines)")
    assert not long, long


#: Every public name of ``autoln`` before the package was laid out in folders, each with what it
#: is: the names a user types (README, *Your own model*) must not move or change kind.
PUBLIC = {"Comparison": "class", "QKNorm": "class", "RaceOutcome": "class", "SearchConfig": "class", "SearchModel": "class",
          "SearchOutcome": "class", "Site": "class", "SiteGenotype": "class", "compare_genotypes": "function",
          "deepnorm_weights": "function", "derive": "function", "load_derived": "function", "map_state_dict": "function",
          "race_genotypes": "function", "search": "function"}


def test_every_public_name_is_still_there_and_is_what_it_was():
    import inspect

    assert sorted(autoln.__all__) == sorted(PUBLIC)
    for name, kind in PUBLIC.items():
        obj = getattr(autoln, name)
        assert (inspect.isclass(obj) if kind == "class" else inspect.isfunction(obj)), name
        assert obj.__name__ == name and obj.__module__.startswith("autoln."), (name, obj.__module__)
        assert obj.__doc__ and len(obj.__doc__) > 80, f"{name} lost its docstring"
    # a folder named like a public name would shadow it once imported (autoln.search is a function)
    import importlib

    for folder in ("api", "oneshot", "retrain", "race", "models"):
        importlib.import_module(f"autoln.{folder}")
    assert inspect.isfunction(autoln.search) and inspect.isfunction(autoln.derive)
    folders = {p.name for p in (ROOT / "autoln").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in (ROOT / "autoln").rglob("*.py")}
    assert not (folders | modules) & set(PUBLIC)


def test_every_folder_says_what_it_is_for():
    """Each folder's ``__init__.py`` opens with a docstring of a few lines: what the folder is for
    and what it hands on."""
    for init in sorted((ROOT / "autoln").rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and len(doc.split()) >= 20 and "TODO" not in doc, f"{init.relative_to(ROOT)} does not say what it is for"


#: Modules allowed past :data:`MODULE_LINES`, each with why (docs/design.md, *Layout*).
LONGER = {}
MODULE_LINES = 500


def test_no_module_runs_over_five_hundred_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "autoln").rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MODULE_LINES}
    assert set(long) <= set(LONGER), long


def test_the_layers_contract_names_every_folder_in_design_md_order():
    """pyproject.toml's layers are the folders of autoln (and diagnose), and docs/design.md's
    layout table lists the same folders in the same order, top to bottom."""
    import re
    import tomllib

    contract = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"][0]
    layers = [[n.strip() for n in re.split(r"[|:]", layer)] for layer in contract["layers"]]
    named = {n for layer in layers for n in layer}
    present = {p.name for p in (ROOT / "autoln").iterdir() if (p / "__init__.py").exists()} | \
        {p.stem for p in (ROOT / "autoln").glob("*.py") if p.stem != "__init__"}
    assert named == present
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `autoln/([a-z_]+)(?:/|\.py)` \| .*? \| ([^|]*) \|$", design, re.M)
    assert [r[0] for r in rows] == [n for layer in layers for n in layer], "docs/design.md's layout table is not the contract's order"
    # its last column: exactly the folders each folder's modules import from (the import graph, function bodies included)
    imports: dict[str, set[str]] = {}
    for module, edges in import_graph(PACKAGE).items():
        here = module.split(".")[0]
        imports.setdefault(here, set()).update(e.split(".")[0] for e in edges if e.split(".")[0] not in (here, "__init__"))
    for name, column in rows:
        listed = set() if column.strip() == "(nothing)" else {c.strip() for c in column.split(",")}
        assert listed == imports.get(name, set()), f"docs/design.md, {name}: lists {sorted(listed)}, imports {sorted(imports.get(name, set()))}"
