"""The race's verdict (docs/design.md §10, docs/race.md): the answer of a finished race and the
line a user reads, from the final's values (:mod:`autoln.race.rule`'s plan) and, where the rule
asks, the finalists' values at longer budgets (``race.horizons``). Lower values are better."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from autoln.core.errors import DivergenceError
from autoln.race.sequential import resolved
from autoln.retrain.ranking import RESOLUTION
from autoln.race.rule import (Entry, RaceRule, Values, final_pair, final_state, horizon_jobs, mean_sd, origin, paired_diffs,
                              score)


@dataclass
class Verdict:
    """The race's answer: ``answer`` (the entry), ``line`` (what the user reads), ``searched``
    and ``named`` (the best finalist of each kind, None when absent), their values per seed,
    ``p_value`` (of the paired test, None without one), ``outcome``: ``searched-wins``,
    ``named-wins`` (a named finalist had the better mean) or ``tie`` (the searched one led
    without passing the test), and ``horizons``: per longer budget of ``rule.horizons`` that
    ran (:func:`horizon_jobs`), its ``multiplier``, ``steps``, both finalists' values per seed and
    ``lead``: ``ahead``, ``level`` (within one standard deviation) or ``behind``."""

    answer: Entry
    line: str
    outcome: str
    searched: Optional[Entry] = None
    named: Optional[Entry] = None
    values: dict[str, list[float]] = field(default_factory=dict)
    p_value: Optional[float] = None
    horizons: list[dict] = field(default_factory=list)


def paired_p(a: Sequence[float], b: Sequence[float]) -> float:
    """One-sided paired t-test of ``a < b`` (values per seed, paired by position):
    ``scipy.stats.ttest_rel(a, b, alternative="less")``'s p-value. When every difference is
    equal (no spread) it is 0 if ``a`` is lower, else 1; a diverged value of ``a`` gives 1, of
    ``b`` alone 0; differences below the values' resolution count as 0
    (:func:`autoln.race.sequential.resolved`)."""
    from scipy.stats import ttest_rel

    a, b = [score(v) for v in a], [score(v) for v in b]
    if any(math.isinf(x) for x in a):
        return 1.0
    if any(math.isinf(x) for x in b):
        return 0.0
    diffs = resolved([x - y for x, y in zip(a, b)])
    if max(diffs) == min(diffs):
        return 0.0 if diffs[0] < 0 else 1.0
    return float(ttest_rel(a, b, alternative="less").pvalue)


def final_seeds_run(finalists: Sequence[Entry], values: Values, full_steps: int, rule: RaceRule) -> int:
    """How many seeds the finished final ran: the first ``n`` at which :func:`final_state` is
    not ``go on`` (``max_seeds`` at most).

    Raises:
        KeyError: the final has not ended: the first finalist's seed it still needs."""
    for n in range(1, rule.max_seeds + 1):
        missing = next(((e.name, full_steps, n - 1) for e in finalists if (e.name, full_steps, n - 1) not in values), None)
        if missing:
            raise KeyError(missing)
        if final_state(finalists, values, full_steps, rule, n) != "go on":
            return n
    return rule.max_seeds


#: The remedy a race with every finalist diverged offers, by entry point (``search.py``'s race
#: has config keys; the API's race the user's own training loop).
REMEDY_CLI = "lower the retrain's learning rate or give it a warm-up (retrain.lr, retrain.warmup_steps)"
REMEDY_API = "lower your train loop's learning rate or give it a warm-up"


def verdict(finalists: Sequence[Entry], values: Values, full_steps: int, rule: RaceRule, unit: str = "",
            remedy: str = REMEDY_CLI) -> Verdict:
    """The answer of a finished race (module docstring, **Verdict**; :func:`final_verdict`),
    with the lead at each longer budget of ``rule.horizons`` that ran (:func:`horizon_jobs`)
    added to the line, e.g. ``...; at 4000 steps not ahead (top1 1.8753 ± 0.0043, mix-ln
    1.8711 ± 0.0047): the lead does not last)``. The answer is the one at the full budget;
    ``remedy`` as :func:`final_verdict`.

    Raises:
        KeyError: a retrain the final or a horizon needs not measured.
        DivergenceError: every finalist diverged at some seed: the race has no answer."""
    v = final_verdict(finalists, values, full_steps, rule, unit, remedy)
    n = final_seeds_run(finalists, values, full_steps, rule)
    jobs = horizon_jobs(finalists, values, full_steps, rule, n)
    if not jobs:
        return v
    u = f" {unit}" if unit else ""
    mine, best = final_pair(finalists, values, full_steps, n)
    words = []
    for k in rule.horizons[1:]:
        steps = k * full_steps
        a = [values[(mine.name, steps, i)] for i in range(rule.final_seeds)]
        b = [values[(best.name, steps, i)] for i in range(rule.final_seeds)]
        (ma, sa), (mb, sb) = mean_sd(a), mean_sd(b)
        state = lead(a, b)
        v.horizons.append({"multiplier": k, "steps": steps, "searched": mine.name, "named": best.name,
                           "values": {mine.name: a, best.name: b}, "lead": state})
        shown = f"{mine.name} {ma:.4f} ± {sa:.4f}, {best.name} {mb:.4f} ± {sb:.4f}{u}"
        words.append(f"at {steps} steps still ahead ({shown})" if state == "ahead" else
                     f"at {steps} steps {'behind' if state == 'behind' else 'level, within one standard deviation'} ({shown})")
    lasts = v.horizons[-1]["lead"] == "ahead"
    tail = "; ".join(words) + ("" if lasts else f": the lead at {full_steps} steps does not last")
    v.line = v.line[:-1] + f"; {tail})"
    return v


def lead(a: Sequence[float], b: Sequence[float]) -> str:
    """``ahead``, ``behind`` or ``level``: the mean of ``a`` against the mean of ``b`` (lower is
    better), a gap within the larger sample standard deviation over seeds, or below the values'
    resolution, being ``level`` (:mod:`autoln.retrain.ranking`'s tie rule)."""
    (ma, sa), (mb, sb) = mean_sd(a), mean_sd(b)
    sd = max(sa, sb, RESOLUTION)
    return "ahead" if ma < mb - sd else ("behind" if ma > mb + sd else "level")


def lead_line(a: Sequence[float], b: Sequence[float], names: tuple[str, str]) -> str:
    """``names[0] mean ± sd, names[1] mean ± sd: still ahead | behind | level (within one
    standard deviation) (gap)``: how ``a`` stands against ``b`` (:func:`lead`), for a line."""
    (ma, sa), (mb, sb) = mean_sd(a), mean_sd(b)
    word = {"ahead": "still ahead", "behind": "behind", "level": "level (within one standard deviation)"}[lead(a, b)]
    return f"{names[0]} {ma:.4f} ± {sa:.4f}, {names[1]} {mb:.4f} ± {sb:.4f}: {word} ({ma - mb:+.4f})"


def final_verdict(finalists: Sequence[Entry], values: Values, full_steps: int, rule: RaceRule, unit: str = "",
                  remedy: str = REMEDY_CLI) -> Verdict:
    """The answer of a finished race at the full budget (module docstring, **Verdict**); ``unit`` names the values
    in the line (e.g. ``bits/byte``). The final's seeds are those it ran
    (:func:`final_seeds_run`); ``p_value`` is the paired t-test's over them, which the line
    sets against that look's nominal level (:meth:`autoln.race.sequential.Design.nominal`).
    Differences below the values' resolution are no lead (a searched finalist equal to the named
    one at seed 0 is ``level with it``). ``remedy``: what the error says to do when every
    finalist diverged (:data:`REMEDY_CLI` for ``search.py``, :data:`REMEDY_API` for the API).

    Raises:
        KeyError: a finalist's seed the final needs not measured.
        DivergenceError: every finalist diverged at some seed: the race has no answer."""
    n = final_seeds_run(finalists, values, full_steps, rule)
    per = {e.name: [values[(e.name, full_steps, i)] for i in range(n)] for e in finalists}
    if all(math.isinf(mean_sd(v)[0]) for v in per.values()):
        raise DivergenceError(f"every finalist of the race diverged at {full_steps} steps ({', '.join(per)}): it has no answer; "
                              f"{remedy}")
    rank = sorted(finalists, key=lambda e: (mean_sd(per[e.name])[0], finalists.index(e)))
    searched = next((e for e in rank if not e.named), None)
    named = next((e for e in rank if e.named), None)
    u = f" {unit}" if unit else ""

    def shown(e: Entry) -> str:
        m, sd = mean_sd(per[e.name])
        return (f"{e.name} {m:.4f}" + (f" ± {sd:.4f}" if n > 1 else "")) if math.isfinite(m) else f"{e.name} diverged"

    at = f"at {full_steps} steps, {n} seeds" if n > 1 else f"at {full_steps} steps, seed 0"
    if named is None:  # no named placement in the pool: the best searched finalist
        return Verdict(rank[0], f"answer: {rank[0].name} ({rank[0].placements}; no named placement raced; {shown(rank[0])}{u} {at})",
                       "searched-wins", searched, None, per)
    if searched is None:
        return Verdict(named, f"answer: {named.name} (the best named placement {at}: {', '.join(shown(e) for e in rank)}{u})",
                       "named-wins", None, named, per)
    design = rule.design
    state = final_state(finalists, values, full_steps, rule, n)
    p = paired_p(per[searched.name], per[named.name]) if n > 1 else None
    test = design.describe()
    single = rule.final_seeds == rule.max_seeds  # one look: the plain paired t-test at level (revision r2's words)
    if state == "win":
        bound = design.nominal()[n]
        test_line = (f"one-sided paired t-test p = {p:.3g} < {rule.level}" if single else
                     f"one-sided paired t-test p = {p:.3g} < {bound:.3g}, the boundary at {n} seeds of {test}")
        whence = origin(searched)
        whence = f"{whence}; " if whence.startswith("proposed") else ""
        return Verdict(searched, f"answer: {searched.name} = {searched.placements} ({whence}beats {named.name} {at}: {shown(searched)}, "
                                 f"{shown(named)}{u}; {test_line})", "searched-wins", searched, named, per, p)
    ahead = sum(paired_diffs(finalists, values, full_steps, n)) < 0
    if not ahead:
        diffs = paired_diffs(finalists, values, full_steps, n)
        level = n == 1 and diffs[0] == 0  # equal within the values' resolution
        where = ("level with it at seed 0" if level else "behind at seed 0") if n == 1 else f"not ahead on the mean over {n} seeds"
        stop = ", so the final stopped there" if n < rule.max_seeds else ""
        return Verdict(named, f"answer: {named.name} (no searched placement beat it {at}: best searched {shown(searched)}, "
                              f"{shown(named)}{u}; {where}, it could not pass {test}{stop})", "named-wins", searched, named, per, p)
    shown_p = "-" if p is None else format(p, ".3g")
    if n < rule.max_seeds:
        why = f"p = {shown_p}; no boundary of {test} within reach at {n} seeds, so the final stopped there"
    else:
        why = f"p = {shown_p}, not below {rule.level}" if single else f"p = {shown_p}, below no boundary of {test} up to {n} seeds"
    return Verdict(named, f"answer: {named.name} (the searched {searched.name} tied with it {at}: {shown(searched)}, {shown(named)}{u}; "
                          f"one-sided paired t-test {why}: the named placement is simpler and known)", "tie", searched, named, per, p)
