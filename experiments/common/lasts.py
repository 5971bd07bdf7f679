"""Does a replayed final's lead last? The verdict the race itself gives with
``race.horizons=[1, k]`` (:func:`autoln.race.verdict.verdict`, the race's own code) on a final's
measured values, and whether its horizon line agrees with the same two finalists at fresh seeds:
the check docs/results.md reports for each race whose answer is searched.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence


def final_seeds(searched: Callable[[int], float], named: Callable[[int], float], design,
                on_seed: Optional[Callable[[int, float, float, str], None]] = None) -> tuple[list[float], list[float], str]:
    """A final run again seed by seed, as the race runs it: ``searched(i)`` and ``named(i)`` give
    the two finalists' values at seed index ``i`` (lower is better; e.g. rows of a retrain table),
    until :func:`autoln.race.sequential.decide` on the paired differences (searched - named) stops
    (the group-sequential one-sided paired t-test of ``design``, docs/race.md, *The final*).
    ``on_seed(i, searched_value, named_value, state)`` is called after each seed. Returns both
    value lists (one per seed, as long as the final ran) and the last state (``win`` or ``lose``).

    Raises:
        whatever ``searched`` or ``named`` raise (e.g. KeyError for a row a table lacks)."""
    from autoln.race.sequential import decide

    mine: list[float] = []
    theirs: list[float] = []
    state = "go on"
    while state == "go on":
        i = len(mine)
        theirs.append(float(named(i)))
        mine.append(float(searched(i)))
        state = decide([a - b for a, b in zip(mine, theirs)], design)
        if on_seed is not None:
            on_seed(i, mine[-1], theirs[-1], state)
    return mine, theirs, state


def horizon_verdict(searched: str, named: tuple[str, str], at_1: dict[str, list[float]], at_k: dict[str, list[float]],
                    multiplier: int, full_steps: int, unit: str):
    """The race's :class:`autoln.race.verdict.Verdict` with ``race.horizons=[1, multiplier]`` on
    a final between the searched finalist ``searched`` (placements; entry name ``searched``) and the
    named one ``named`` (``(name, placements)``). ``at_1``: entry name -> the final's values at
    ``full_steps`` steps, seed by seed (the seeds it ran, or more: the final's own stop rule picks
    how many count); ``at_k``: entry name -> values at ``multiplier * full_steps`` steps, seeds
    ``0..final_seeds-1`` (:func:`autoln.race.rule.horizon_jobs`). ``unit`` names the values in the
    line (e.g. ``bits/byte``). Lower values are better. The final is the group-sequential one-sided
    paired t-test with Lan-DeMets O'Brien-Fleming spending (docs/race.md, *The final*); the horizon's
    lead is :func:`autoln.race.verdict.lead` (a gap beyond the larger standard deviation over seeds).

    Raises:
        KeyError: a seed the final or the horizon needs is missing."""
    from autoln.race.rule import Entry, RaceRule
    from autoln.race.verdict import verdict

    finalists = [Entry("searched", searched, "searched"), Entry(named[0], named[1], "named")]
    values = {}
    for e in finalists:
        values.update({(e.name, full_steps, i): float(v) for i, v in enumerate(at_1[e.name])})
        values.update({(e.name, multiplier * full_steps, i): float(v) for i, v in enumerate(at_k[e.name])})
    return verdict(finalists, values, full_steps, RaceRule(horizons=(1, multiplier)), unit)


def race_horizon(value: Callable[[str, int, int], float], searched: str, named: tuple[str, str], full_steps: int,
                 multiplier: int, unit: str):
    """:func:`horizon_verdict` from a value function: ``value(entry, i, steps)`` gives the validation
    loss (lower is better) of ``"searched"`` or ``named[0]`` at seed index ``i`` after ``steps``
    steps (e.g. a row of a retrain table). The final at ``full_steps`` is run again seed by seed
    (:func:`final_seeds`, rule r3's design), then both finalists at ``multiplier * full_steps``
    for seeds ``0..final_seeds-1``, the searched one's first (:func:`autoln.race.rule.horizon_jobs`).

    Raises:
        whatever ``value`` raises; KeyError as :func:`horizon_verdict`."""
    from autoln.race.rule import RaceRule

    rule = RaceRule()
    mine, theirs, _ = final_seeds(lambda i: value("searched", i, full_steps), lambda i: value(named[0], i, full_steps), rule.design)
    at_k = {e: [value(e, i, multiplier * full_steps) for i in range(rule.final_seeds)] for e in ("searched", named[0])}
    return horizon_verdict(searched, named, {"searched": mine, named[0]: theirs}, at_k, multiplier, full_steps, unit)


def agreement(v, fresh_searched: Sequence[float], fresh_named: Sequence[float]) -> str:
    """``its horizon line (<lead>) agrees | does NOT agree with the fresh seeds (<lead>)``: the
    verdict ``v``'s lead at its longest horizon (:func:`horizon_verdict`) against the lead of the
    same finalists at fresh seeds at that budget (:func:`autoln.race.verdict.lead`); a verdict
    without a horizon (the searched finalist not ahead at the full budget) says so."""
    from autoln.race.verdict import lead

    fresh = lead(fresh_searched, fresh_named)
    if not v.horizons:
        return f"the verdict has no horizon line (the searched finalist did not lead); the fresh seeds: {fresh}"
    said = v.horizons[-1]["lead"]
    return f"its horizon line ({said}) {'agrees' if said == fresh else 'does NOT agree'} with the fresh seeds ({fresh})"
