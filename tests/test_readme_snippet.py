"""The README's Python snippet under *Your own model* runs as written, at its stated sizes (4
layers of width 64, block 64: the model it builds has 0.2M weights, not nanoGPT's default 124M),
from the repository's root, with 3 steps in place of its 500 (search and race)."""

from __future__ import annotations

import re
import sys

from .conftest import ROOT


def readme_python() -> str:
    """The ```python block of the README's *Your own model* section."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Your own model", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's 'Your own model' has no ```python block"
    return match.group(1)


def test_the_readme_snippet_runs_as_written_at_its_sizes(tmp_path, monkeypatch, capsys):
    code = readme_python()
    assert code.count("steps=500") == 2  # the search's and the race's budget: the only change made here
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    (tmp_path / "README.md").symlink_to(ROOT / "README.md")
    monkeypatch.chdir(tmp_path)  # "run from this repository's root": its files, and what it writes lands here
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("gpt", "nanogpt_recipe"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    scope: dict = {"__name__": "readme_snippet"}
    exec(compile(code.replace("steps=500", "steps=3"), "README.md (Your own model)", "exec"), scope)
    model, race, fresh = scope["model"], scope["race"], scope["fresh"]
    out = capsys.readouterr().out
    assert out.count("number of parameters: 0.20M") == 1  # nanoGPT's own count, once: not once per model the race builds
    assert f"the supernet's read-off: {scope['outcome'].genotype.describe()}\n" in out  # the supernet's choice, shown
    assert scope["answer"].describe() == race.genotype.describe()  # the saved answer, read back in Python
    assert 0.15e6 < sum(p.numel() for p in model.parameters()) < 0.3e6  # the supernet too: a CPU's size, not 124M
    assert {"genotype.json", "supernet_genotype.json"} <= {p.name for p in tmp_path.iterdir()}
    import autoln

    answer = autoln.SiteGenotype.load(tmp_path / "genotype.json")
    assert answer.describe() == race.genotype.describe() and list(answer.sites)[0] == "transformer.h.0.attn_site"
    chosen = [next(iter(m.placements)) for m in fresh.modules() if isinstance(m, autoln.Site)]
    assert " ".join(chosen) == race.genotype.describe()
    assert race.record["full_steps"] == 3 and race.verdict.line.count("nats/char") >= 1
