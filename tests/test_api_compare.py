"""``autoln.compare_genotypes`` on the tiny example model: its numbers are those of training each model by
hand at the same seeds (a user's loop and the default loop), ties follow ``retrain.py
--compare``'s rule, and bad arguments are refused in one line."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

import autoln
from autoln.api.comparing import CompareRow, Comparison, verdict
from autoln.config import RetrainConfig
from autoln.retrain.ranking import is_tie
from autoln.engine.training import evaluate_batches, train_step, weight_optimizer

from .test_nanogpt_diff import EXAMPLE, load

CANDIDATES = ("pre", "post", "deepnorm")
SIZE = dict(block_size=16, vocab_size=32, n_layer=2, n_head=2, n_embd=16, bias=False)


@pytest.fixture(scope="module")
def gpt():
    return load(EXAMPLE, "example_gpt_compare")


def _data(n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(x, torch.roll(x, -1, 1)) for x in (torch.randint(0, 32, (4, 16), generator=g) for _ in range(n))]


def _genotype(gpt) -> autoln.SiteGenotype:
    sites = [f"transformer.h.{i}.{s}_site" for i in range(2) for s in ("attn", "mlp")]
    chosen = ["deepnorm", "pre", "post", "pre"]
    return autoln.SiteGenotype(list(CANDIDATES), dict(zip(sites, chosen)),
                               {s: [1 / 3] * 3 for s in sites})


def my_train(model, seed):
    """A user's loop: its own optimizer, its own batch order by seed."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for x, y in _data(4, 100 + seed):
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_compare_equals_training_each_model_by_hand_with_a_user_loop(gpt):
    valid = _data(3, 7)

    def my_eval(model):
        return float(evaluate_batches(model, valid, torch.device("cpu")))

    build = lambda: gpt.GPT(gpt.GPTConfig(**SIZE, norm_candidates=CANDIDATES))  # noqa: E731
    g = _genotype(gpt)
    result = autoln.compare_genotypes(build, g, baselines=("pre", "post"), seeds=[0, 1], train=my_train, evaluate=my_eval, progress=False)
    assert {r.name for r in result.rows} == {"searched", "all-pre", "all-post"} and result.seeds == [0, 1]
    by_hand = {}
    for name, placement in (("searched", None), ("all-pre", "pre"), ("all-post", "post")):
        vals = []
        for seed in (0, 1):
            torch.manual_seed(seed)
            if placement == "pre":  # the model's own placement: the unchanged model, no derive at all
                model = gpt.GPT(gpt.GPTConfig(**SIZE, norm_candidates=("pre",)))
            else:
                model = build()
                autoln.derive(model, g if placement is None else autoln.SiteGenotype(
                    list(CANDIDATES), {s: placement for s in g.sites}, {s: [0.0, 1.0, 0.0] for s in g.sites}))
            my_train(model, seed)
            vals.append(my_eval(model))
        by_hand[name] = vals
    for name, vals in by_hand.items():
        assert result.row(name).values == vals, name  # exactly: the same numbers, not close ones
    assert [r.name for r in result.rows] == sorted(by_hand, key=lambda n: statistics.mean(by_hand[n]))
    assert len(result.notes) == 2 and all(n.startswith("searched ") for n in result.notes)


def test_compare_with_the_default_loop_equals_autoln_s_steps_by_hand(gpt):
    train, valid = _data(3, 1), _data(2, 2)
    cfg = RetrainConfig(steps=5, warmup_steps=1, lr=3e-3)
    build = lambda: gpt.GPT(gpt.GPTConfig(**SIZE, norm_candidates=CANDIDATES))  # noqa: E731
    result = autoln.compare_genotypes(build, {"mine": _genotype(gpt)}, baselines=(), seeds=1, train_batches=train,
                            valid_batches=valid, cfg=cfg, progress=False)
    torch.manual_seed(0)
    model = autoln.derive(build(), _genotype(gpt))
    opt, sched = weight_optimizer(list(model.named_parameters()), cfg)
    model.train()
    for step in range(5):
        train_step(model, opt, sched, *train[step % 3], cfg.grad_clip)  # the batches in order, re-iterated
    assert result.row("mine").values == [float(evaluate_batches(model, valid, torch.device("cpu")))]


def test_ties_follow_the_rule_of_retrain_compare():
    a, b = CompareRow("searched", "pre pre", [2.30, 2.32, 2.34]), CompareRow("all-pre", "pre pre", [2.31, 2.33, 2.35])
    assert is_tie(a.values, b.values) and verdict(a, b) == \
        "searched ties all-pre: 2.3200 against 2.3300 nats/token, gap -0.0100 (within one std)"
    c = CompareRow("searched", "post post", [2.44, 2.45, 2.46])
    assert verdict(c, b) == "searched loses to all-pre: 2.4500 against 2.3300 nats/token, gap +0.1200"
    assert verdict(c, b, "nats/char").endswith("2.3300 nats/char, gap +0.1200")
    table = Comparison([b, c], [0, 1, 2]).table()
    assert table.startswith("| model | placements | mean ± std (nats/token) |")
    assert "| all-pre | pre pre | 2.3300 ± 0.0200 | 2.3100 / 2.3300 / 2.3500 | best |" in table
    assert "| searched | post post | 2.4500 ± 0.0100 | 2.4400 / 2.4500 / 2.4600 | +0.1200 |" in table
    tied = Comparison([a, b], [0, 1, 2]).table()
    assert "+0.0100 (tie: within one std)" in tied
    one = CompareRow("x", "pre", [2.0])
    assert not is_tie(one.values, [2.1]) and "one seed" in verdict(one, CompareRow("all-pre", "pre", [2.1]))
    assert is_tie(one.values, [2.0])  # one seed tells no noise, but equal values are equal (the values' resolution)
    assert verdict(one, CompareRow("all-pre", "pre", [2.0])) == "x ties all-pre: 2.0000 against 2.0000 nats/token, gap +0.0000 (equal)"
    assert math.isclose(a.std, 0.02)


@pytest.mark.parametrize("kwargs, match", [
    (dict(seeds=0), "seeds: expected a positive count"),
    (dict(seeds=[1, 1]), "seeds: expected a positive count .e.g. 3. or a list of distinct integer seeds"),
    (dict(baselines=("peri",), train=my_train, evaluate=lambda m: 1.0), r"baselines: 'peri' is not among the sites' candidates \['pre', 'post', 'deepnorm'\]"),
    (dict(train_batches=iter([])), "train_batches: expected a list or a DataLoader"),
    (dict(train=my_train), "pass valid_batches"),
])
def test_compare_refuses_bad_arguments_in_one_line(gpt, kwargs, match):
    build = lambda: gpt.GPT(gpt.GPTConfig(**SIZE, norm_candidates=CANDIDATES))  # noqa: E731
    with pytest.raises(ValueError, match=match):
        autoln.compare_genotypes(build, _genotype(gpt), progress=False, **kwargs)


def test_a_diverged_run_is_left_out_not_a_crash():
    """A NaN or inf score (a diverged run) is left out of the mean, as retrain.py --compare does."""
    row = CompareRow("all-post", "post", [2.4, float("nan"), 2.6])
    assert math.isclose(row.mean, 2.5) and math.isclose(row.std, math.sqrt(0.02))
    dead = CompareRow("all-none", "none", [float("inf")] * 2)
    assert dead.mean == float("inf")
    table = Comparison([row, dead], [0, 1, 2]).table()
    assert "| all-post | post | 2.5000 ± 0.1414 | 2.4000 / nan / 2.6000 | best |" in table and "| all-none | none | - |" in table
    assert "loses to" in verdict(dead, row)


def test_a_redirected_log_gets_a_line_per_run_with_its_unit_and_the_time_left(gpt, capsys):
    """Off a terminal (here pytest's capture) ``compare_genotypes`` writes one line per finished
    run: the value in ``unit``, the runs done out of all, and the estimated time left; the
    report's table names the unit."""
    import re

    build = lambda: gpt.GPT(gpt.GPTConfig(**SIZE, norm_candidates=CANDIDATES))  # noqa: E731
    valid = _data(2, 7)
    autoln.compare_genotypes(build, _genotype(gpt), baselines=("pre",), seeds=[0, 1], train=my_train,
                             evaluate=lambda m: float(evaluate_batches(m, valid, torch.device("cpu"))), unit="nats/char")
    captured = capsys.readouterr()
    lines = [ln for ln in captured.err.splitlines() if ln.startswith("autoln.compare_genotypes: ")]
    want = r"autoln\.compare_genotypes: (searched|all-pre) seed [01]: \d\.\d{4} nats/char \((\d)/4 runs, about \d\d:\d\d left\)"
    found = [re.fullmatch(want, ln) for ln in lines]
    assert all(found) and [int(m.group(2)) for m in found] == [1, 2, 3, 4], lines
    assert "| model | placements | mean ± std (nats/char) |" in captured.out
