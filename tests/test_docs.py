"""The repository stands alone: no tracked file cites a path outside it or a design-notes
section that does not exist, and the README's and design notes' links resolve."""

from __future__ import annotations

import re
import subprocess

import pytest

from .conftest import ROOT

DESIGN = ROOT / "docs" / "design.md"
#: What points outside a clone: relative paths that leave it, the developer machine's folders,
#: and the developers' reference document (the repository's own notes are docs/design.md).
OUTSIDE = re.compile(r"\.\./[\w.]|/work/|\bDESIGN(\.md| §)|shared/DESIGN")
#: A citation of the design notes: ``docs/design.md §4`` or ``§2-3``, ``§8, §4``.
CITATION = re.compile(r"docs/design\.md((?:,? ?§\d+(?:[-.]\d+)?)+)")


def tracked_files() -> list:
    """The files git tracks, plus new ones it does not ignore (text files only)."""
    try:
        names = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    files = []
    for name in names:
        path = ROOT / name
        if path.is_file():
            try:
                files.append((name, path.read_text(encoding="utf-8")))
            except UnicodeDecodeError:
                pass  # binary
    return files


def design_sections() -> set:
    return {int(m) for m in re.findall(r"^## (\d+)\. ", DESIGN.read_text(encoding="utf-8"), flags=re.M)}


def test_no_tracked_file_points_outside_the_repository():
    bad = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
           for name, text in tracked_files() if name != "tests/test_docs.py" for m in OUTSIDE.finditer(text)]
    assert not bad, "citations of paths outside the repository:\n" + "\n".join(bad)


def test_every_design_citation_names_an_existing_section():
    sections = design_sections()
    assert sections == set(range(1, len(sections) + 1)) and len(sections) >= 8
    cited, bad = 0, []
    for name, text in tracked_files():
        for m in CITATION.finditer(text):
            for first, last in re.findall(r"§(\d+)(?:-(\d+))?", m.group(1)):
                for n in range(int(first), int(last or first) + 1):
                    cited += 1
                    if n not in sections:
                        bad.append(f"{name}: {m.group(0)}")
    assert cited > 20 and not bad, bad


def test_markdown_links_resolve_inside_the_repository():
    """Every link of the README and the docs resolves to a file of the repository (a leading
    ``/`` is the repository's root, as GitHub reads it)."""
    bad = []
    for doc in (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))):
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"https?://", target) or target.startswith("#"):
                continue
            base = ROOT if target.startswith("/") else doc.parent
            path = (base / target.split("#")[0].lstrip("/")).resolve()
            if not path.exists() or ROOT.resolve() not in path.parents:
                bad.append(f"{doc.name}: {target}")
    assert not bad, bad


def test_the_configuration_reference_is_current_and_complete():
    """docs/configuration.md is what the config dataclasses generate: every key with its default
    and a meaning (a key added without one fails here)."""
    from autoln.config.reference import reference_markdown

    text = reference_markdown()  # raises KeyError for a key without a meaning
    assert (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8") == text, \
        "docs/configuration.md is stale: run python -m autoln.config.reference --write docs/configuration.md"
    assert "| `search.steps` | `500` |" in text and "| `retrain.steps` | `1000` |" in text and "| `model.residual_init` | `scaled` |" in text


def plain_signature(name: str) -> str:
    """``autoln.<name>(...)`` as the README writes it: the parameters of ``inspect.signature``
    without annotations, ``*`` before the keyword-only ones, defaults by ``repr``."""
    import inspect

    import autoln

    parts, star = [], False
    for p in inspect.signature(getattr(autoln, name)).parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            parts.append("*")
            star = True
        parts.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return f"autoln.{name}({', '.join(parts)})"


def test_every_documented_signature_is_the_code_s():
    """Each bullet of docs/usage.md's *The Python API* that opens with a call's signature
    (```- `autoln.f(...)` ```) gives the function's whole signature, as ``inspect.signature`` has
    it; the API's entry points are all documented so, and the README points there."""
    assert "docs/usage.md#the-python-api" in (ROOT / "README.md").read_text(encoding="utf-8")
    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    documented = dict(re.findall(r"^- `(autoln\.(\w+)\(.*?\))`", text, re.M))
    documented = {name: sig for sig, name in documented.items()}
    assert {"search", "derive", "compare_genotypes", "race_genotypes", "load_derived"} <= set(documented)
    for name, sig in documented.items():
        assert sig == plain_signature(name), f"docs/usage.md: {sig}\n  code: {plain_signature(name)}"


def test_no_user_facing_file_speaks_of_issues_or_of_today():
    """The README, docs, configs and examples speak to a user: no issue numbers, no "today's"."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "configs").glob("*.yaml")),
             *sorted((ROOT / "examples").glob("*.py"))]
    found = [f"{f.relative_to(ROOT)}:{i + 1}: {line.strip()[:80]}" for f in files
             for i, line in enumerate(f.read_text(encoding="utf-8").splitlines())
             if re.search(r"\bissues? \d+|\btoday\b|\btoday's\b", line, re.I)]
    assert not found, "\n".join(found)
