"""The race: the supernet shortlists, real retrains decide (docs/design.md §10).

The rule, and only the rule, lives here and in :mod:`autoln.race.schedule` (what runs next):
pure functions of the measurements so far, shared by ``search.py``'s race (run through an
Optuna study, :mod:`autoln.race.run_race`), the API's (:func:`autoln.race_genotypes`) and the
replay of a race from a table of retrains (``experiments/race/race_replay.py``). Lower values
are better throughout (a valid loss, bits per byte).

- **Pool.** Entries, each a genotype (its placements, the identity: a genotype is entered once)
  of kind ``searched`` (the supernet's read-off, its argmax, its top ``k`` by one-hot score) or
  ``named`` (the uniform placements of the candidates, ``mix-ln``, ``pre-post``; in a user's
  model its ``own`` placement, which is named and always a finalist). A searched genotype equal
  to a named one is entered as the named one (simpler, and known).
- **Rungs.** Successive halving (Jamieson & Talwalkar 2016), synchronous, over the *searched*
  entries: rung ``k`` of ``R`` retrains from scratch at ``full_steps / eta^(R-1-k)`` steps (seed
  index 0) and keeps the best ``ceil(n / eta)``; after the last short rung the best one goes on.
  A short rung only prunes the supernet's speculative shortlist; it never answers.
- **Named rung.** The named placements are known and few, and learning curves cross (Wu et al.
  2018): in nanoGPT's own model ``all-outnorm`` trails ``all-pre`` until about two thirds of the
  budget and beats it at the end, so any shorter rung prunes the best named placement
  (docs/race.md). Every named placement is therefore retrained at ``full_steps`` (seed index 0),
  beside the searched rungs; the best of them (and the model's own) go on.
- **Final rung.** The best searched entry and the best named one (and the model's own placement,
  when it is in the pool) at ``full_steps``. A pool of two or three entries goes to the final
  rung directly. The final runs seed by seed, from ``final_seeds`` up to ``max_seeds`` seeds,
  as a group-sequential test (:mod:`autoln.race.sequential`): the searched finalist wins at a
  look when the one-sided paired t-test against the best named finalist passes that look's
  nominal level, the levels set by an alpha-spending function so that the false-win rate over
  all looks is at most ``level``; the final stops as soon as the searched finalist wins, is not
  ahead on the mean of the paired differences, or can no longer reach a boundary (futility;
  non-binding, so it only lowers the false-win rate). With ``max_seeds == final_seeds`` this is
  the plain paired t-test over ``final_seeds`` seeds (revision ``r2``).
- **Verdict.** The searched finalist is the answer when the final ended in its win; otherwise
  the best named finalist is, and the line says whether the searched one was behind or tied
  (ahead on the mean without crossing a boundary). A diverged run (NaN or inf) counts as
  infinitely bad.

Why not an Optuna pruner: Optuna's pruners decide one trial at the moment it reports, and a
trial cannot be suspended and resumed (the reason Optuna's own ``SuccessiveHalvingPruner`` is
the asynchronous ASHA, whose promotions depend on the order in which trials report).
Synchronous halving needs every entry of a rung measured before any is promoted, so the race's
trials are its retrains (one trial per entry, rung and seed, enqueued when the rung before is
complete) and :func:`autoln.race.schedule.plan` decides from their values. Proposal rounds
(``proposer``) are :mod:`autoln.race.schedule`'s.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from autoln.race.sequential import SPENDING, Design, decide, resolved

KINDS = ("searched", "named")

#: The proposers ``RaceRule.proposer`` names (:data:`autoln.race.propose.PROPOSERS` holds them;
#: ``none``: the supernet's shortlist alone, no proposal rounds).
PROPOSER_NAMES = ("none", "random", "prior", "local", "ridge", "tpe", "gp")

#: The rule's revision, recorded with every race of the experiments' tables (``races.csv``,
#: ``own_model_race.csv``) so that a race is rerun, not reused, when the rule changes: ``r1``
#: entered the named placements at the last-but-one rung and ran every finalist at every seed;
#: ``r2`` runs them at the full budget and stops the final once its verdict is settled; ``r3``
#: (this module) makes the final group-sequential, up to ``max_seeds`` seeds.
REVISION = "r3"


@dataclass(frozen=True)
class RaceRule:
    """The race's settings: ``eta`` (each rung keeps ``ceil(n / eta)``), ``rungs`` (``R``, the
    last at the full budget), ``final_seeds`` (the final's first look, at least 2), ``level``
    (the false-win rate of the final over all its looks), ``max_seeds`` (its last look) and
    ``spending`` (the alpha-spending function: ``obrien-fleming`` or ``pocock``;
    :mod:`autoln.race.sequential`) and ``horizons`` (multiples of the full budget at which the
    two finalists are also retrained, ``final_seeds`` seeds each, when the searched one led on
    the mean: does the lead last? ``(1,)``: not at all). ``proposer`` (one of
    :data:`PROPOSER_NAMES`), ``budget`` and ``proposals``: after the searched entries' rungs,
    rounds of ``proposals`` genotypes chosen by the proposer from every retrain measured so far
    (:mod:`autoln.race.propose`) run the same rungs, while the searched entries' retrain steps,
    every round together, stay within ``budget`` full-budget retrains (BOHB's model-based
    successive halving, Falkner et al. 2018; :mod:`autoln.race.schedule`).

    Raises:
        ValueError: ``eta`` < 2, ``rungs`` < 1, ``final_seeds`` < 2, ``max_seeds`` below
            ``final_seeds``, ``level`` outside (0, 0.5), an unknown ``spending``, ``horizons``
            not increasing integers from 1, an unknown ``proposer``, a negative ``budget`` or
            ``proposals`` below 1."""

    eta: int = 3
    rungs: int = 3
    final_seeds: int = 3
    level: float = 0.05
    max_seeds: int = 6
    spending: str = "obrien-fleming"
    horizons: tuple[int, ...] = (1,)
    proposer: str = "none"
    budget: float = 7.0
    proposals: int = 5

    def __post_init__(self) -> None:
        if self.proposer not in PROPOSER_NAMES or not self.budget >= 0 or self.proposals < 1:
            raise ValueError(f"race rule: proposer must be one of {list(PROPOSER_NAMES)}, budget >= 0 (full-budget retrains) and "
                             f"proposals >= 1; got proposer {self.proposer!r}, budget {self.budget}, proposals {self.proposals}")
        object.__setattr__(self, "horizons", tuple(self.horizons))
        if not self.horizons or self.horizons[0] != 1 or any(not isinstance(k, int) or b <= a
                                                             for a, b, k in zip(self.horizons, self.horizons[1:], self.horizons[1:])):
            raise ValueError(f"race rule: horizons must be increasing integer multiples of the budget from 1, e.g. (1, 4); "
                             f"got {self.horizons}")
        if self.eta < 2 or self.rungs < 1 or self.final_seeds < 2 or not 0 < self.level < 0.5 \
                or self.max_seeds < self.final_seeds or self.spending not in SPENDING:
            raise ValueError(f"race rule: needs eta >= 2, rungs >= 1, final_seeds >= 2, max_seeds >= final_seeds, 0 < level < 0.5 "
                             f"and spending one of {list(SPENDING)}; got eta {self.eta}, rungs {self.rungs}, final_seeds "
                             f"{self.final_seeds}, max_seeds {self.max_seeds}, level {self.level}, spending {self.spending!r}")

    @property
    def design(self) -> Design:
        """The final's group-sequential design (:class:`autoln.race.sequential.Design`)."""
        return Design(self.final_seeds, self.max_seeds, self.level, self.spending)

    def describe(self) -> str:
        """The rule in one sentence (written into ``race.json`` and the verdict's provenance)."""
        return (f"synchronous successive halving of the searched entries, eta {self.eta}, the last rung at the full retrain budget; "
                f"every named placement at the full budget (one seed); the best searched and the best named entry are the "
                f"finalists, run seed by seed; a searched finalist is the answer only if it beats the best named finalist by "
                f"{self.design.describe()}; the final stops at a win, or once the searched finalist is not ahead on the mean or "
                f"can no longer reach a boundary, and the named placement is then the answer"
                + ("" if len(self.horizons) == 1 else
                   f"; when the searched finalist led on the mean, both finalists are retrained at "
                   f"{', '.join(f'{k}x' for k in self.horizons[1:])} the budget ({self.final_seeds} seeds) to see whether the lead lasts")
                + ("" if self.proposer == "none" else
                   f"; {'random genotypes' if self.proposer == 'random' else 'the shortlist, then genotypes proposed by ' + self.proposer} "
                   f"enter in rounds of {self.proposals} while the searched entries' retrains stay within {self.budget:g} "
                   f"full-budget retrains"))


@dataclass(frozen=True)
class Entry:
    """One genotype of the pool: ``name`` (``read-off``, ``argmax``, ``top2``, ``all-pre``,
    ``own`` ...), ``placements`` (its identity, e.g. ``post pre pre``), ``kind`` (``searched`` or
    ``named``) and ``own`` (the model's own placement: always a finalist)."""

    name: str
    placements: str
    kind: str
    own: bool = False

    @property
    def named(self) -> bool:
        """True for a named placement (the model's own included)."""
        return self.kind == "named"


def origin(entry: Entry) -> str:
    """Where ``entry`` came from, in words: ``named`` (``own`` for the model's own placement),
    ``the supernet's read-off``, ``the supernet's argmax``, ``the supernet's shortlist`` (``topK``),
    ``proposed by P at round R`` (an entry :mod:`autoln.race.schedule` named ``P<R>-<i>``), else
    ``given`` (an API user's own name)."""

    if entry.named:
        return "own" if entry.own else "named"
    fixed = {"read-off": "the supernet's read-off", "argmax": "the supernet's argmax"}
    if entry.name in fixed:
        return fixed[entry.name]
    if re.fullmatch(r"top\d+", entry.name):
        return "the supernet's shortlist"
    m = re.fullmatch(r"([a-z]+)(\d+)-\d+", entry.name)
    if m and m.group(1) in PROPOSER_NAMES:
        return f"proposed by {m.group(1)} at round {m.group(2)}"
    return "given"


def make_pool(searched: Sequence[tuple[str, str]], named: Sequence[tuple[str, str]],
              own: Optional[tuple[str, str]] = None) -> tuple[list[Entry], dict[str, str]]:
    """The pool: ``own`` first, then ``named``, then ``searched`` (each ``(name, placements)``),
    every placement once. Returns ``(entries, aliases)``: ``aliases`` maps each dropped name to
    the entry that holds its placements (``{"read-off": "all-pre"}``: the read-off *is* all-pre).

    Raises:
        ValueError: an empty pool, or two entries of one name."""
    entries: list[Entry] = []
    by_placements: dict[str, str] = {}
    aliases: dict[str, str] = {}
    items = ([(own[0], own[1], "named", True)] if own else []) + [(n, p, "named", False) for n, p in named] \
        + [(n, p, "searched", False) for n, p in searched]
    names = [n for n, *_ in items]
    if len(set(names)) != len(names):
        raise ValueError(f"race pool: two entries share a name: {names}")
    for name, placements, kind, is_own in items:
        if placements in by_placements:
            aliases[name] = by_placements[placements]
            continue
        by_placements[placements] = name
        entries.append(Entry(name, placements, kind, is_own))
    if not entries:
        raise ValueError("race pool: no entry")
    return entries, aliases


def rung_steps(full_steps: int, rule: RaceRule) -> list[int]:
    """Steps of each rung: ``full_steps / eta^(R-1-k)`` rounded, at least 1, distinct, the last
    ``full_steps``. E.g. ``(1000, eta 3, 3 rungs) -> [111, 333, 1000]``.

    Raises:
        ValueError: ``full_steps`` < 1."""
    if full_steps < 1:
        raise ValueError(f"race: the full budget must be at least 1 step, got {full_steps}")
    steps = [max(1, round(full_steps / rule.eta ** (rule.rungs - 1 - k))) for k in range(rule.rungs)]
    return sorted(set(steps))


@dataclass(frozen=True)
class Job:
    """One retrain of the race: ``entry`` (a name) at ``steps`` with seed index ``seed`` (the
    retrain's seed is the race's base seed plus this)."""

    entry: str
    steps: int
    seed: int

    @property
    def key(self) -> tuple[str, int, int]:
        """``(entry, steps, seed)``: how a measurement is found."""
        return (self.entry, self.steps, self.seed)


Values = Mapping[tuple[str, int, int], float]


def score(value: float) -> float:
    """A measurement as the race ranks it: NaN and inf (a diverged run) are ``inf``."""
    return value if math.isfinite(value) else math.inf


def ranked(entries: Sequence[Entry], values: Mapping[str, float]) -> list[Entry]:
    """``entries`` best first by ``values`` (entry name -> value; NaN and inf last), ties by
    the order given."""
    return sorted(entries, key=lambda e: (score(values[e.name]), entries.index(e)))


def finalists_of(searched: Sequence[Entry], named: Sequence[Entry], at: Mapping[str, float]) -> list[Entry]:
    """The finalists, in pool order (named, then searched): the named placements' best by
    ``at`` (entry name -> value at the full budget, seed 0) and the model's own, then
    ``searched`` (the short rungs' survivor: at most one). With no searched entry, the two best
    named ones."""
    best = ranked(named, at)[:1 if searched else 2]
    keep = {e.name for e in best} | {e.name for e in named if e.own}
    return [e for e in named if e.name in keep] + list(searched)


def final_pair(finalists: Sequence[Entry], values: Values, full_steps: int, seeds: int) -> Optional[tuple[Entry, Entry]]:
    """``(best searched, best named)`` finalist by the mean over the first ``seeds`` seeds (ties
    by pool order), or None without a finalist of each kind.

    Raises:
        KeyError: a finalist's seed below ``seeds`` not measured."""
    per = {e.name: [score(values[(e.name, full_steps, i)]) for i in range(seeds)] for e in finalists}
    named = [e for e in finalists if e.named]
    searched = [e for e in finalists if not e.named]
    if not named or not searched:
        return None
    best = min(named, key=lambda e: (mean_sd(per[e.name])[0], finalists.index(e)))
    mine = min(searched, key=lambda e: (mean_sd(per[e.name])[0], finalists.index(e)))
    return mine, best


def horizon_jobs(finalists: Sequence[Entry], values: Values, full_steps: int, rule: RaceRule, seeds: int) -> list[Job]:
    """The retrains that say whether the lead lasts (``rule.horizons`` beyond 1): the best
    searched and the best named finalist at each ``k * full_steps``, seeds ``0..final_seeds-1``,
    when the final ran ``seeds`` seeds and the searched finalist led on their mean; none else.

    Raises:
        KeyError: a finalist's seed below ``seeds`` not measured."""
    pair = final_pair(finalists, values, full_steps, seeds)
    diffs = paired_diffs(finalists, values, full_steps, seeds)
    if pair is None or len(rule.horizons) == 1 or not diffs or not sum(diffs) < 0:
        return []
    return [Job(e.name, k * full_steps, i) for k in rule.horizons[1:] for i in range(rule.final_seeds) for e in pair]


def paired_diffs(finalists: Sequence[Entry], values: Values, full_steps: int, seeds: int) -> Optional[list[float]]:
    """The searched finalist's paired differences to the best named finalist (by the mean over
    the first ``seeds`` seeds; ties by pool order) at those seeds, searched minus named (lower
    is better; a diverged run counts as ``inf``, so a diverged searched run gives ``inf`` or
    ``nan``; a difference below the values' resolution is 0: :func:`autoln.race.sequential.resolved`);
    None without a finalist of each kind.

    Raises:
        KeyError: a finalist's seed below ``seeds`` not measured."""
    pair = final_pair(finalists, values, full_steps, seeds)
    if pair is None:
        return None
    mine, best = pair
    per = {e.name: [score(values[(e.name, full_steps, i)]) for i in range(seeds)] for e in pair}
    return resolved([a - b if not (math.isinf(a) and math.isinf(b)) else math.nan for a, b in zip(per[mine.name], per[best.name])])


def final_state(finalists: Sequence[Entry], values: Values, full_steps: int, rule: RaceRule, seeds: int) -> str:
    """Where the final stands after its first ``seeds`` seeds: ``win`` (the searched finalist
    crossed a boundary), ``lose`` (it cannot win any more: :func:`autoln.race.sequential.decide`),
    ``go on``, or ``done`` (a final without a finalist of each kind, after ``final_seeds`` seeds).

    Raises:
        KeyError: a finalist's seed below ``seeds`` not measured."""
    diffs = paired_diffs(finalists, values, full_steps, seeds)
    if diffs is None:
        return "done" if seeds >= rule.final_seeds else "go on"
    return decide(diffs, rule.design)


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """``(mean, sample std)`` with a diverged value making the mean ``inf``."""
    xs = [score(v) for v in values]
    if any(math.isinf(x) for x in xs):
        return math.inf, 0.0
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)
