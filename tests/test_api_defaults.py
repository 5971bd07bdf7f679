"""``autoln.search`` without ``cfg`` runs ``search.py``'s default schedule, scaled only for fewer
steps, and warns in one line when the alphas cannot separate in the steps given."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import autoln
from autoln import api
from autoln.config import SearchConfig, load_config

from .test_nanogpt_diff import EXAMPLE, load


@pytest.fixture(scope="module")
def gpt():
    return load(EXAMPLE, "example_gpt_defaults")


def _tiny(gpt):
    torch.manual_seed(0)
    return gpt.GPT(gpt.GPTConfig(block_size=8, vocab_size=16, n_layer=2, n_head=2, n_embd=8, norm_candidates=("pre", "post", "deepnorm")))


def _data():
    g = torch.Generator().manual_seed(0)
    return [(x, torch.roll(x, -1, 1)) for x in (torch.randint(0, 16, (4, 8), generator=g) for _ in range(8))]


def test_the_default_schedule_is_the_command_s():
    cli = load_config(None).search  # what search.py runs without --config or --set
    assert api.default_config() == cli == SearchConfig()
    assert (cli.steps, cli.warmup_steps, cli.arch_warmup_steps, cli.selection) == (500, 50, 100, "perturbation")
    for steps in (500, 2000):  # at or above the default: the command's warm-ups, as --set search.steps=N
        assert api.default_config(steps) == replace(cli, steps=steps)
    assert api.default_config(300) == replace(cli, steps=300, warmup_steps=30, arch_warmup_steps=60)  # scaled
    assert api.default_config(7) == replace(cli, steps=7, warmup_steps=0, arch_warmup_steps=1)
    with pytest.raises(ValueError, match="steps: expected a positive integer, got 0"):
        api.default_config(0)


def test_search_without_steps_or_cfg_runs_the_command_s_schedule(gpt, monkeypatch):
    seen = {}

    def fake(model, cfg, *rest):
        seen["cfg"] = cfg
        raise RuntimeError("stop here")

    monkeypatch.setattr("autoln.api.searching._search", fake)
    for kwargs, want in ((dict(), SearchConfig()), (dict(steps=300), api.default_config(300)),
                         (dict(cfg=SearchConfig(steps=40, warmup_steps=4, arch_warmup_steps=8)),
                          SearchConfig(steps=40, warmup_steps=4, arch_warmup_steps=8)),
                         (dict(cfg=SearchConfig(steps=40, warmup_steps=4, arch_warmup_steps=8), steps=30),
                          SearchConfig(steps=30, warmup_steps=4, arch_warmup_steps=8))):
        with pytest.raises(RuntimeError, match="stop here"):
            autoln.search(_tiny(gpt), _data(), progress=False, **kwargs)
        assert seen["cfg"] == want, kwargs


@pytest.mark.parametrize("steps, arch_lr, k, warns", [
    (500, 1e-2, 3, False), (300, 1e-2, 3, False), (100, 1e-2, 3, True), (100, 3e-2, 3, False),
    (500, 0.0, 3, False), (200, 1e-2, 7, True), (300, 1e-2, 7, False)])
def test_the_travel_warning_follows_its_bound(steps, arch_lr, k, warns):
    cfg = replace(api.default_config(steps), arch_lr=arch_lr)
    assert api.alpha_travel_warning(replace(cfg, selection="score"), k) is None  # the alphas are not read
    reach = 2 * arch_lr * (steps - cfg.arch_warmup_steps)
    assert (api.alpha_travel_warning(cfg, k) is not None) == warns == (0 < reach < math.log(9 * (k - 1)))


def test_a_search_too_short_for_the_alphas_says_so_in_one_line(gpt, capsys):
    cfg = SearchConfig(steps=12, warmup_steps=1, arch_warmup_steps=2, eval_every=6, eval_windows=4, selection_windows=4,
                       selection_tune_steps=1)
    outcome = autoln.search(_tiny(gpt), _data(), cfg=cfg, progress=False)
    err = capsys.readouterr().err
    line = ("the alphas cannot separate in 12 steps: 10 alpha steps at arch_lr 0.01 move them at "
            "most 0.20 apart, and one of 3 candidates needs 2.89 to reach probability 0.9; give more steps (145 alpha steps "
            "after the 2-step warm-up at least; the command's default is 500 steps) or a larger arch_lr in cfg")
    assert f"autoln.search: warning: {line}" in err.splitlines() and outcome.notes[0] == line
    quiet = autoln.search(_tiny(gpt), _data(), cfg=replace(cfg, selection="score"), progress=False)
    assert "warning" not in capsys.readouterr().err and not any("cannot separate" in n for n in quiet.notes)
