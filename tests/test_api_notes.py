"""What ``search.py`` says about a weak answer, ``autoln.search`` says too: arbitrary choices,
ties of the loss rises and how they were broken, overruled probabilities, no clear winner;
printed with ``progress`` and returned in the outcome's ``notes``."""

from __future__ import annotations

import torch

import autoln
from autoln.api import genotype_notes
from autoln.config import SearchConfig

from .test_api_defaults import _data, _tiny, gpt  # noqa: F401 (fixture)

C = ["pre", "post", "deepnorm"]


def _genotype(sites, chosen, probs, rises):
    return autoln.SiteGenotype(C, dict(zip(sites, chosen)), dict(zip(sites, probs)),
                               {"selection": "perturbation", "loss_rises": dict(zip(sites, rises))})


def test_the_issue_s_site_is_named_a_tie_and_an_overruled_probability():
    """DeepNorm chosen at a site where pre had 0.757, on rises of 0.00025 or less (the issue's case)."""
    g = _genotype(["h.0.attn_site", "h.0.mlp_site"], ["deepnorm", "pre"],
                  [[0.757, 0.121, 0.122], [0.80, 0.10, 0.10]],
                  [[0.0001, -0.00003, 0.00025], [0.30, 0.01, 0.02]])
    assert genotype_notes(g) == [
        "loss rises within 0.001 nats/token of the chosen one's at h.0.attn_site (deepnorm +0.00025 against pre +0.0001, "
        "post -3e-05): a tie on the selection batches, broken by the largest rise",
        "the loss rises overruled the largest probability at h.0.attn_site (deepnorm over pre 0.757)"]


def test_arbitrary_and_undecided_sites_are_named():
    g = _genotype(["a_site", "b_site"], ["pre", "post"], [[0.40, 0.35, 0.25], [0.1, 0.8, 0.1]],
                  [[-0.01, -0.02, None], [0.01, 0.2, 0.05]])
    assert genotype_notes(g, seed=4) == [
        "at a_site removing any candidate does not raise the loss: the choice there is arbitrary",
        "no clear winner (top probability leads the runner-up by less than 0.15) at a_site; check the answer's agreement "
        "across seeds: autoln.search(..., seed=5) and seed=6 on fresh models"]
    clear = _genotype(["b_site"], ["post"], [[0.1, 0.8, 0.1]], [[0.01, 0.2, 0.05]])
    assert genotype_notes(clear) == []


def test_a_search_prints_its_notes_with_progress_and_returns_them(gpt, capsys):  # noqa: F811
    cfg = SearchConfig(steps=12, warmup_steps=1, arch_warmup_steps=2, eval_every=6, eval_windows=4, selection_windows=4,
                       selection_tune_steps=1, arch_lr=1.0)
    outcome = autoln.search(_tiny(gpt), _data(), cfg=cfg, progress=True)
    err = capsys.readouterr().err
    assert outcome.notes and outcome.notes == genotype_notes(outcome.genotype)
    printed = [line[len("autoln.search: note: "):] for line in err.splitlines() if line.startswith("autoln.search: note: ")]
    assert printed == outcome.notes
    torch.manual_seed(0)
    quiet = autoln.search(_tiny(gpt), _data(), cfg=cfg, progress=False)
    assert quiet.notes == outcome.notes and "autoln.search: note:" not in capsys.readouterr().err
