"""The race's group-sequential final (autoln.race.sequential): boundaries against published tables
and closed forms, the t-test's limits, and the false-win rate and power by simulation."""

from __future__ import annotations

import math

import pytest
from scipy.stats import norm, t

from autoln.race.sequential import Design, decide, reachable, simulate, spent, t_boundaries, t_stat, z_boundaries


def test_spending_functions_spend_the_level_by_the_last_look():
    for kind in ("obrien-fleming", "pocock"):
        assert spent(1.0, 0.05, kind) == pytest.approx(0.05, abs=1e-12) and spent(0.0, 0.05, kind) == 0.0
    # O'Brien-Fleming type at half the information: 2 - 2 Phi(z_{0.975} / sqrt(0.5)) = 2 - 2 Phi(2.7718) = 0.005575
    assert spent(0.5, 0.05, "obrien-fleming") == pytest.approx(2 - 2 * norm.cdf(1.959964 / math.sqrt(0.5)), rel=1e-6)
    assert spent(0.5, 0.05, "obrien-fleming") == pytest.approx(0.005575, abs=2e-6)
    assert spent(0.5, 0.05, "pocock") == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 2), rel=1e-12)  # 0.031004
    with pytest.raises(ValueError, match="race.spending"):
        spent(0.5, 0.05, "linear")


def test_boundaries_against_published_tables():
    # Lan-DeMets O'Brien-Fleming type, 4 equally spaced looks, one-sided 0.025 (two-sided 0.05):
    # 4.333, 2.963, 2.359, 2.014 (Jennison & Turnbull 2000, Table 7.6; gsDesign's sfLDOF)
    assert z_boundaries((1, 2, 3, 4), 0.025, "obrien-fleming") == pytest.approx((4.333, 2.963, 2.359, 2.014), abs=1.5e-3)
    # two looks: 2.963, 1.969; Lan-DeMets Pocock type, two looks: 2.157, 2.201
    assert z_boundaries((1, 2), 0.025, "obrien-fleming") == pytest.approx((2.963, 1.969), abs=1.5e-3)
    assert z_boundaries((1, 2), 0.025, "pocock") == pytest.approx((2.157, 2.201), abs=1.5e-3)
    # the first look alone is a normal quantile, counted by hand: c_1 = Phi^-1(1 - alpha(t_1)), t_1 = 3 / 6
    first = z_boundaries((3, 4, 5, 6), 0.05, "obrien-fleming")[0]
    assert first == pytest.approx(norm.isf(spent(0.5, 0.05, "obrien-fleming")), abs=1e-3)


def test_the_default_design_s_t_boundaries_spend_the_level_exactly():
    import numpy as np

    d = Design(3, 6, 0.05, "obrien-fleming")
    levels = d.nominal()
    assert list(levels) == [3, 4, 5, 6]
    # the first look has no earlier one: Student's quantile of alpha(1/2), counted by hand
    assert d.t_bound(3) == pytest.approx(t.ppf(spent(0.5, 0.05, "obrien-fleming"), 2), rel=1e-12)
    assert levels[3] == pytest.approx(0.005575, abs=2e-6)
    assert levels[3] < levels[4] < levels[5] < levels[6] < 0.05  # O'Brien-Fleming: late looks get most of the level
    assert [round(d.t_bound(n), 1) for n in (4, 5, 6)] == [-4.1, -2.9, -2.3]
    # on fresh null paths (another seed) the boundaries are crossed, look by look, as the spending allows
    paths = 200_000
    x = np.random.default_rng(123).standard_normal((paths, 6))
    alive, total = np.ones(paths, bool), 0
    for n in d.looks:
        stat = x[:, :n].mean(1) / (x[:, :n].std(1, ddof=1) / math.sqrt(n))
        crossed = alive & (stat <= d.t_bound(n))
        alive &= ~crossed
        total += crossed.mean()
        assert total == pytest.approx(spent(n / 6, 0.05, "obrien-fleming"), abs=3 * math.sqrt(0.05 / paths) + 5e-4)
    assert Design(3, 3, 0.05).nominal() == {3: pytest.approx(0.05)}  # one look: the plain paired t-test
    assert t_boundaries((3,), 0.05, "pocock") == (pytest.approx(t.ppf(0.05, 2)),)
    with pytest.raises(ValueError, match="final_seeds"):
        Design(3, 2)
    with pytest.raises(KeyError):
        d.t_bound(2)


def test_t_stat_and_what_future_seeds_can_reach():
    assert t_stat([-1.0, -2.0, -3.0]) == pytest.approx(-2.0 / (1.0 / math.sqrt(3)))
    assert t_stat([-1.0, -1.0]) == -math.inf and t_stat([1.0, 1.0]) == math.inf and math.isnan(t_stat([1.0]))
    # one difference >= 0 among n: t >= -(n - 1); with no spread yet, equal future values reach -inf
    assert not reachable([0.0], 3, -2.0001) and reachable([0.0], 3, -1.99)
    assert reachable([-1.0, -1.0], 4, -100.0)
    assert reachable([], 5, -50.0) and reachable([-1.0, -2.0, -3.0], 3, -3.0) and not reachable([-1.0, -2.0, -3.0], 3, -4.0)


def test_decide_wins_stops_for_futility_and_goes_on():
    d = Design(3, 6, 0.05)
    assert decide([], d) == "go on" and decide([0.0], d) == "lose" and decide([0.5, -0.1], d) == "lose"  # not ahead on the mean
    assert decide([-0.02, -0.005, -0.03], d) == "go on"  # t = -2.52 at 3 seeds, the boundary -9.39
    assert decide([-0.02, -0.005, -0.03, -0.01], d) == "go on"  # t = -2.93 at 4 seeds, the boundary -4.12
    assert decide([-0.02, -0.005, -0.03, -0.01, -0.02], d) == "win"  # t = -3.92 at 5 seeds, the boundary -2.87
    assert decide([-0.02, 0.01, -0.03, 0.015, -0.001, 0.02], d) == "lose"  # the last look without a win
    assert decide([-0.1, math.inf], d) == "lose"  # the searched finalist diverged
    assert decide([-0.1, -math.inf, -0.1], d) == "win"  # only the named one diverged, from the first look on


def test_the_false_win_rate_is_the_level_and_the_power_beats_three_seeds():
    """At a small seeded size (the full 10,000-final table is experiments/race/final_power.py's):
    under the null the sequential final wins about ``level`` of the time; at a lead of two paired
    standard deviations it wins far more often than the 3-seed test."""
    null = simulate(Design(3, 6, 0.05), 0.0, 3000, seed=1)
    assert null["win"] <= 0.05 + 3 * null["win_se"] and null["win"] > 0.02
    assert 1.0 < null["seeds"] < 3.0  # futility ends most null finals early
    seq, fixed = simulate(Design(3, 6, 0.05), 2.0, 1000, seed=2), simulate(Design(3, 3, 0.05), 2.0, 1000, seed=2)
    assert seq["win"] > fixed["win"] + 0.15 and fixed["seeds"] <= 3.0 < seq["seeds"] <= 6.0
