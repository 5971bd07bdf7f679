"""The race's proposal rounds (autoln.race.schedule) and proposers (autoln.race.propose): the
round structure and budget counted by hand, the z-scores and the ridge posterior against
closed forms, determinism, and each model-based proposer finding a rigged good site."""

import math

import numpy as np
import pytest

from autoln.race.propose import PROPOSERS, RidgeProposer, Space, longest, make_proposer, rung_scores
from autoln.race.rule import PROPOSER_NAMES, Entry, RaceRule, make_pool, origin
from autoln.race.schedule import most_steps, plan, proposal_names, proposal_rounds, round_steps, searched_steps, steps_done

C7 = ("pre", "post", "deepnorm", "peri", "outnorm", "lns", "none")
SHORTLIST = [("read-off", "pre post post pre pre pre"), ("argmax", "pre pre pre pre pre post"),
             ("top1", "post pre outnorm pre pre pre"), ("top2", "pre pre pre peri pre pre"), ("top3", "lns pre pre pre none pre")]
NAMED = [(f"all-{c}", " ".join([c] * 6)) for c in C7]


def test_the_registry_is_the_rule_s_list_of_names():
    assert PROPOSER_NAMES == ("none", *PROPOSERS)
    assert make_proposer("none", Space(C7, 6)) is None
    with pytest.raises(ValueError, match="race.proposer: expected one of"):
        make_proposer("bohb", Space(C7, 6))
    with pytest.raises(ValueError, match="proposer must be one of"):
        RaceRule(proposer="bohb")


def test_space_encodes_per_block_and_per_sublayer_placements():
    s = Space(("pre", "post"), 4, group=2)
    assert s.encode("pre/post post/post") == (0, 1, 1, 1)
    assert s.decode((0, 1, 1, 1)) == "pre/post post/post"
    with pytest.raises(ValueError, match="is not 4 placements"):
        s.encode("pre post")
    with pytest.raises(ValueError, match="prior must have shape"):
        Space(C7, 6, np.ones((6, 3)))


def test_round_steps_and_budget_counted_by_hand():
    rule = RaceRule(proposer="tpe", budget=7)
    assert round_steps(5, 1000, rule) == 5 * 111 + 2 * 333 + 1000 == 2221
    assert round_steps(3, 1000, rule) == 3 * 111 + 1000  # ceil(3 / 3) = 1 left after 111: no 333-step rung
    assert round_steps(1, 1000, rule) == 1000 and round_steps(0, 1000, rule) == 0
    assert proposal_rounds(5, 1000, rule) == 2  # 2221 * 3 = 6663 <= 7000 < 8884
    assert searched_steps(5, 1000, rule) == 6663
    assert proposal_names(5, 1000, rule) == [f"tpe{r}-{i}" for r in (1, 2) for i in range(1, 6)]
    assert proposal_names(0, 1000, RaceRule(proposer="random", budget=7))[:2] == ["random0-1", "random0-2"]
    assert proposal_rounds(5, 1000, RaceRule()) == 0 and proposal_names(5, 1000, RaceRule()) == []


def test_rung_scores_and_longest_against_values_counted_by_hand():
    seen = [("a", 10, 1.0), ("b", 10, 3.0), ("c", 10, math.inf), ("a", 100, 5.0)]
    assert rung_scores(seen) == [("a", 10, -1.0), ("b", 10, 1.0), ("c", 10, 2.0), ("a", 100, 0.0)]
    assert longest(seen) == {"a": 0.0, "b": 1.0, "c": 2.0}


def test_the_ridge_posterior_mean_is_ridge_regression_without_a_prior():
    space = Space(("x", "y", "z"), 2)
    seen = [("x x", 1, 1.0), ("x y", 1, 2.0), ("y z", 1, 4.0), ("z z", 1, 3.5), ("y x", 1, 0.5)]
    mean, cov = RidgeProposer(space).posterior(seen)
    X = np.zeros((5, 6))
    for k, (g, _, _) in enumerate(seen):
        X[k, [i * 3 + c for i, c in enumerate(space.encode(g))]] = 1
    y = np.array([z for _, _, z in rung_scores(seen)])
    lam = RidgeProposer.NOISE_SD ** 2 / RidgeProposer.PRIOR_SD ** 2
    np.testing.assert_allclose(mean, np.linalg.solve(X.T @ X + lam * np.eye(6), X.T @ y), atol=1e-10)
    np.testing.assert_allclose(cov, np.linalg.inv(X.T @ X / RidgeProposer.NOISE_SD ** 2 + np.eye(6) / RidgeProposer.PRIOR_SD ** 2))


@pytest.mark.parametrize("name", [n for n in PROPOSERS if n != "gp"])
def test_a_proposer_is_deterministic_and_never_proposes_a_taken_genotype(name):
    space = Space(C7, 6, np.random.default_rng(0).dirichlet(np.ones(7), 6))
    seen = sorted((g, 111, float(i)) for i, (_, g) in enumerate(SHORTLIST))
    taken = frozenset(g for _, g in SHORTLIST + NAMED)
    a = make_proposer(name, space, 3)(1, 5, seen, taken)
    assert a == make_proposer(name, space, 3)(1, 5, seen, taken) and len(a) == 5 == len(set(a))
    assert not set(a) & taken


def rigged(placements: str, steps: int) -> float:
    """A rigged evaluation: one good site (``deepnorm`` at site 2, 1.0 lower), every other
    choice within 0.1, the same ranking at every rung."""
    eff = np.random.default_rng(7).uniform(-0.1, 0.1, size=(6, 7))
    eff[2, 2] = -1.0
    return 3.0 + 100 / steps + sum(eff[i, c] for i, c in enumerate(Space(C7, 6).encode(placements)))


def race(name: str, seed: int) -> tuple[list[str], object]:
    """The rigged race of ``name``: the placements it retrained in order, and its last plan."""
    rule = RaceRule(proposer=name, budget=7)
    entries, _ = make_pool([] if name == "random" else SHORTLIST, NAMED)
    proposer = make_proposer(name, Space(C7, 6), seed)
    values, order = {}, []
    while True:
        p = plan(entries, values, 1000, rule, proposer)
        if p.done:
            return order, p
        for job in p.pending:
            placements = next(e.placements for e in entries + p.proposed if e.name == job.entry)
            order.append(placements)
            values[job.key] = rigged(placements, job.steps)


@pytest.mark.parametrize("name,seeds", [("local", (0, 1, 2)), ("ridge", (0, 1, 2)), ("tpe", (0, 1, 2)), ("gp", (0,))])
def test_a_model_based_proposer_finds_the_rigged_good_site_in_its_first_round(name, seeds):
    """Round 0 (the shortlist, none with the good site) and the named rung take 15 retrains
    (5 + 2 + 1 searched, 7 named; ``all-deepnorm`` holds the good site); the proposer's first
    round is retrains 16-20: a genotype with the good site is among them, and the race's searched
    finalist has it."""
    for seed in seeds:
        order, p = race(name, seed)
        searched = [i for i, g in enumerate(order) if g.split()[2] == "deepnorm" and g != " ".join(["deepnorm"] * 6)]
        assert searched and searched[0] < 20, (name, seed, searched[:1])
        assert next(e for e in p.finalists if not e.named).placements.split()[2] == "deepnorm"
        assert [e.name for e in p.proposed][:5] == [f"{name}1-{i}" for i in range(1, 6)]
        assert origin(p.proposed[0]) == f"proposed by {name} at round 1"


def test_the_random_proposer_has_no_shortlist_and_the_race_keeps_within_its_bound():
    order, p = race("random", 0)
    assert [e.name for e in p.proposed] == [f"random{r}-{i}" for r in (0, 1, 2) for i in range(1, 6)]
    rule = RaceRule(proposer="random", budget=7)
    entries, _ = make_pool([], NAMED)
    assert len(order) <= 3 * (5 + 2 + 1) + 7 + 2 * 5  # three rounds, the named rung, the final's seeds 1-5 of two finalists
    assert most_steps(entries, 1000, rule) == 3 * 2221 + 7 * 1000 + 3 * 5 * 1000  # at most 3 finalists (a model's own among them)


def test_plan_refuses_a_proposer_that_does_not_match_the_rule():
    entries, _ = make_pool(SHORTLIST, NAMED)
    with pytest.raises(ValueError, match="propose is missing"):
        plan(entries, {}, 1000, RaceRule(proposer="tpe"))
    with pytest.raises(ValueError, match="propose is given"):
        plan(entries, {}, 1000, RaceRule(), make_proposer("tpe", Space(C7, 6)))


def test_a_round_waits_for_the_named_rung():
    """Round 1 is proposed from round 0 and the named rung: with a named value missing, the plan
    asks for it and proposes nothing, whichever retrain a worker finished first."""
    rule = RaceRule(proposer="local", budget=7)
    entries, _ = make_pool(SHORTLIST, NAMED)
    proposer = make_proposer("local", Space(C7, 6), 0)
    values = {}
    while True:
        todo = [j for j in plan(entries, values, 1000, rule, proposer).pending if j.entry != "all-none"]
        if not todo:
            break
        for j in todo:
            values[j.key] = rigged(next(e.placements for e in entries if e.name == j.entry), j.steps)
    p = plan(entries, values, 1000, rule, proposer)
    assert [j.entry for j in p.pending] == ["all-none"] and not p.proposed
    values[("all-none", 1000, 0)] = rigged(" ".join(["none"] * 6), 1000)
    assert [e.name for e in plan(entries, values, 1000, rule, proposer).proposed] == [f"local1-{i}" for i in range(1, 6)]
    assert steps_done(values) == 2221 + 7 * 1000


def test_an_entry_s_origin():
    assert origin(Entry("read-off", "a", "searched")) == "the supernet's read-off"
    assert origin(Entry("top2", "a", "searched")) == "the supernet's shortlist"
    assert origin(Entry("ridge2-4", "a", "searched")) == "proposed by ridge at round 2"
    assert origin(Entry("all-pre", "a", "named")) == "named" and origin(Entry("own", "a", "named", True)) == "own"
    assert origin(Entry("mine", "a", "searched")) == "given"
