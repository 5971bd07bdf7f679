"""What the race runs next (docs/design.md §10; the rule's parts are :mod:`autoln.race.rule`):
a pure function of the measurements so far, so that a resumed race, every worker on one
storage and a replay from a table agree.

- **Rounds.** The searched entries run synchronous successive halving (Jamieson & Talwalkar
  2016): rung ``k`` of ``R`` at ``full_steps / eta^(R-1-k)`` steps (seed 0) keeps the best
  ``ceil(n / eta)``, the last short rung the best one, whose seed 0 then runs at ``full_steps``.
  Round 0 is the pool's searched entries (the supernet's read-off, argmax and shortlist). With a
  proposer (``rule.proposer``, :mod:`autoln.race.propose`), each further round is
  ``rule.proposals`` genotypes the proposer picks from every retrain measured so far (seed 0,
  every rung, the named placements' included), run through the same rungs, while the searched
  entries' retrain steps, all rounds together, stay within ``rule.budget`` full-budget retrains:
  model-based successive halving as in BOHB (Falkner et al. 2018), the supernet's shortlist the
  first round. A pool without searched entries and a proposer (``random``: random search through
  the same race) has its round 0 proposed too. A round waits for the named rung, so what a
  proposer sees never depends on which retrain finished first.
- **Named rung.** Every named placement at ``full_steps`` (seed 0), beside the rounds: no short
  rung judges a named placement by how fast it starts (short-horizon bias, Wu et al. 2018).
- **Final.** The best round survivor at ``full_steps`` (seed 0) and the best named placement (and
  the model's own) run seed by seed until :func:`autoln.race.rule.final_state` says it ended, then
  the finalists at the longer ``rule.horizons``. Without a proposer, a pool of three entries or
  fewer goes to the final at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from autoln.race.rule import Entry, Job, RaceRule, Values, finalists_of, horizon_jobs, ranked, rung_steps, final_state

#: ``propose(round, n, seen, taken) -> placements``: ``n`` genotypes (placements strings, e.g.
#: ``"post pre pre"``) for ``round``, none of them in ``taken``, from ``seen`` (``(placements,
#: steps, value)`` of every seed-0 retrain measured, in a fixed order); the same answer for the
#: same arguments (:class:`autoln.race.propose.Proposer`).
Propose = Callable[[int, int, Sequence[tuple[str, int, float]], frozenset], list]


@dataclass
class Plan:
    """Where the race stands: ``pending`` (the jobs to run next, none measured), ``rungs`` (per
    rung reached: its steps, the entries run there, the survivors, ``seeds``, and ``round`` for
    a proposal round), ``done`` and, when done, the ``finalists`` and ``seeds`` (the final rung's
    seeds measured, at most ``max_seeds``); ``proposed``: the entries the proposer added so far
    (:func:`autoln.race.rule.origin` says where each came from)."""

    pending: list[Job]
    rungs: list[dict] = field(default_factory=list)
    done: bool = False
    finalists: list[Entry] = field(default_factory=list)
    seeds: int = 0
    proposed: list[Entry] = field(default_factory=list)


def round_rungs(n: int, full_steps: int, rule: RaceRule) -> list[tuple[int, int]]:
    """``(steps, entries)`` of every rung one round of ``n`` searched entries runs (seed 0): the
    short rungs while more than one entry is left, then the survivor at ``full_steps``; ``[]``
    for ``n`` 0. E.g. ``(5, 1000, eta 3, 3 rungs) -> [(111, 5), (333, 2), (1000, 1)]``, and
    ``(3, ...) -> [(111, 3), (1000, 1)]``: the best of 3 at 111 steps is alone, so the 333-step
    rung does not run (:func:`plan` runs exactly these).

    Raises:
        ValueError: as :func:`autoln.race.rule.rung_steps`."""
    out, alive, short = [], n, rung_steps(full_steps, rule)[:-1]
    for k, s in enumerate(short):
        if alive <= 1:
            break
        out.append((s, alive))
        alive = 1 if k == len(short) - 1 else math.ceil(alive / rule.eta)
    return out + ([(full_steps, 1)] if n else [])


def round_steps(n: int, full_steps: int, rule: RaceRule) -> int:
    """The retrain steps of one round of ``n`` searched entries at most: its short rungs and the
    survivor's seed 0 at ``full_steps`` (:func:`round_rungs`). E.g. ``(5, 1000, eta 3, 3 rungs)
    -> 5 * 111 + 2 * 333 + 1000 = 2221``.

    Raises:
        ValueError: as :func:`autoln.race.rule.rung_steps`."""
    return sum(s * a for s, a in round_rungs(n, full_steps, rule))


def rungs_text(entries: Sequence[Entry], full_steps: int, rule: RaceRule) -> str:
    """What :func:`plan` will run over ``entries``, in words, for the pool's printout: e.g.
    ``3 searched at 111 steps, the best 1 at 1000; 5 named at 1000; the final at 1000 steps, 3
    to 6 seeds`` (every number a rung that runs: :func:`round_rungs`).

    Raises:
        ValueError: as :func:`autoln.race.rule.rung_steps`."""
    searched, named = sum(not e.named for e in entries), sum(e.named for e in entries)
    final = f"the final at {full_steps} steps, {rule.final_seeds} to {rule.max_seeds} seeds"
    if len(rule.horizons) > 1:
        final += f" (then at {', '.join(str(k * full_steps) for k in rule.horizons[1:])} steps if the searched one leads)"
    if rule.proposer == "none" and (len(entries) <= 3 or len(rung_steps(full_steps, rule)) == 1):
        return f"no short rung ({len(entries)} entries go straight to the final): {final}"

    def rungs(n: int, who: str) -> str:
        (s0, n0), *rest = round_rungs(n, full_steps, rule)
        return ", ".join([f"{n0} {who} at {s0} steps"] + [f"the best {a} at {s}" for s, a in rest])

    parts = [rungs(searched, "searched")] if searched else []
    rounds = proposal_rounds(searched, full_steps, rule)
    if rule.proposer != "none" and not searched:
        parts.append(rungs(rule.proposals, f"proposed by {rule.proposer}"))
    if rounds:
        parts.append(f"then up to {rounds} rounds of " + rungs(rule.proposals, f"proposed by {rule.proposer}"))
    return "; ".join(parts + ([f"{named} named at {full_steps}"] if named else []) + [final])


def proposal_rounds(first: int, full_steps: int, rule: RaceRule) -> int:
    """How many proposal rounds a race can run after a round 0 of ``first`` searched entries
    (``rule.proposals`` proposed ones when ``first`` is 0): as many rounds of ``rule.proposals``
    as fit ``rule.budget`` full-budget retrains with round 0; 0 without a proposer."""
    if rule.proposer == "none":
        return 0
    spent, more, rounds = round_steps(first or rule.proposals, full_steps, rule), round_steps(rule.proposals, full_steps, rule), 0
    while spent + more <= rule.budget * full_steps:
        spent, rounds = spent + more, rounds + 1
    return rounds


def searched_steps(first: int, full_steps: int, rule: RaceRule) -> int:
    """The searched entries' retrain steps at most: round 0 of ``first`` entries (``rule.proposals``
    proposed ones when ``first`` is 0 and there is a proposer) and every proposal round."""
    if rule.proposer == "none":
        return round_steps(first, full_steps, rule)
    return round_steps(first or rule.proposals, full_steps, rule) \
        + proposal_rounds(first, full_steps, rule) * round_steps(rule.proposals, full_steps, rule)


def proposal_names(first: int, full_steps: int, rule: RaceRule) -> list[str]:
    """Every entry name the proposal rounds can give (``<proposer><round>-<i>``, round 0 only
    when ``first`` is 0), e.g. for a worker's list of the race's entries."""
    if rule.proposer == "none":
        return []
    rounds = range(0 if first == 0 else 1, proposal_rounds(first, full_steps, rule) + 1)
    return [f"{rule.proposer}{r}-{i}" for r in rounds for i in range(1, rule.proposals + 1)]


def _halving(alive: list[Entry], values: Values, full_steps: int, rule: RaceRule,
             tag: dict) -> tuple[list[dict], list[Job], Optional[Entry]]:
    """One round's rungs: ``(history, pending, survivor)``, the survivor once its seed 0 at
    ``full_steps`` is measured (None while ``pending``, or for an empty round)."""
    history: list[dict] = []
    short = rung_steps(full_steps, rule)[:-1]
    for k, s in enumerate(short):
        if len(alive) <= 1:
            break
        history.append({"steps": s, "entries": [e.name for e in alive], **tag})
        pending = [Job(e.name, s, 0) for e in alive if (e.name, s, 0) not in values]
        if pending:
            return history, pending, None
        keep = 1 if k == len(short) - 1 else math.ceil(len(alive) / rule.eta)
        kept = {e.name for e in ranked(alive, {e.name: values[(e.name, s, 0)] for e in alive})[:keep]}
        alive = [e for e in alive if e.name in kept]
        history[-1]["survivors"] = [e.name for e in alive]
    if alive and (alive[0].name, full_steps, 0) not in values:
        return history, [Job(alive[0].name, full_steps, 0)], None
    return history, [], (alive[0] if alive else None)


def seen_of(entries: Sequence[Entry], values: Values) -> list[tuple[str, int, float]]:
    """``(placements, steps, value)`` of every seed-0 measurement of ``entries``, ordered by
    steps, then placements: what a proposer sees."""
    by_name = {e.name: e.placements for e in entries}
    return sorted((by_name[k[0]], k[1], float(v)) for k, v in values.items() if k[2] == 0 and k[0] in by_name)


def _rounds(entries: list[Entry], values: Values, full_steps: int, rule: RaceRule, propose: Optional[Propose],
            named_done: bool) -> tuple[list[dict], list[Job], list[Entry], list[Entry]]:
    """Every round so far: ``(history, pending, survivors, proposed)``."""
    history: list[dict] = []
    survivors: list[Entry] = []
    proposed: list[Entry] = []
    current = [e for e in entries if not e.named]
    last, r = proposal_rounds(len(current), full_steps, rule), 0
    if not current and propose is not None:
        current = _proposed(0, rule, propose, [], entries)
        proposed += current
    while True:
        tag = {"round": r} if propose is not None else {}
        h, pending, survivor = _halving(current, values, full_steps, rule, tag)
        history += h
        if pending:
            return history, pending, survivors, proposed
        survivors += [survivor] if survivor else []
        if propose is None or not named_done or r >= last:
            return history, [], survivors, proposed
        r += 1
        current = _proposed(r, rule, propose, seen_of(entries + proposed, values), entries + proposed)
        if not current:
            return history, [], survivors, proposed
        proposed += current


def _proposed(r: int, rule: RaceRule, propose: Propose, seen: list, known: list[Entry]) -> list[Entry]:
    """Round ``r``'s entries, named ``<proposer><r>-<i>``: the proposer's genotypes that no known
    entry holds, each once."""
    taken = frozenset(e.placements for e in known)
    out: list[Entry] = []
    for placements in propose(r, rule.proposals, seen, taken):
        if placements not in taken and placements not in {e.placements for e in out}:
            out.append(Entry(f"{rule.proposer}{r}-{len(out) + 1}", placements, "searched"))
    return out[:rule.proposals]


def plan(entries: Sequence[Entry], values: Values, full_steps: int, rule: RaceRule, propose: Optional[Propose] = None) -> Plan:
    """What the race runs next, from the measurements so far (``values``: ``Job.key`` ->
    value; module docstring). The pending jobs are the named rung's and the current round's
    together (independent: workers run them side by side).

    Raises:
        ValueError: ``rule.proposer`` set and no ``propose`` given, or ``propose`` given with
            ``rule.proposer`` ``none``."""
    if (rule.proposer == "none") != (propose is None):
        raise ValueError(f"race plan: rule.proposer is {rule.proposer!r} but propose is {'missing' if propose is None else 'given'}")
    entries = list(entries)
    history: list[dict] = []
    proposed: list[Entry] = []
    if propose is None and (len(entries) <= 3 or len(rung_steps(full_steps, rule)) == 1):
        finalists = entries
    else:
        named = [e for e in entries if e.named]
        named_pending = [Job(e.name, full_steps, 0) for e in named if (e.name, full_steps, 0) not in values]
        history, pending, survivors, proposed = _rounds(entries, values, full_steps, rule, propose, not named_pending)
        if named:
            history.append({"steps": full_steps, "entries": [e.name for e in named], "seeds": 1, "named": True})
        if named_pending or pending:
            return Plan(named_pending + pending, history, proposed=proposed)
        best = ranked(survivors, {e.name: values[(e.name, full_steps, 0)] for e in survivors})[:1]
        finalists = finalists_of(best, named, {e.name: values[(e.name, full_steps, 0)] for e in named})
        if named:
            history[-1]["survivors"] = [e.name for e in finalists if e.named]
    history.append({"steps": full_steps, "entries": [e.name for e in finalists], "seeds": rule.max_seeds})
    for i in range(rule.max_seeds):  # seed by seed, until the sequential final ends
        missing = [Job(e.name, full_steps, i) for e in finalists if (e.name, full_steps, i) not in values]
        if missing:
            return Plan(missing, history, proposed=proposed)
        if final_state(finalists, values, full_steps, rule, i + 1) != "go on":
            history[-1]["seeds"] = i + 1
            return _horizons(finalists, values, full_steps, rule, history, i + 1, proposed)
    return _horizons(finalists, values, full_steps, rule, history, rule.max_seeds, proposed)


def _horizons(finalists: list[Entry], values: Values, full_steps: int, rule: RaceRule, history: list[dict], seeds: int,
              proposed: list[Entry]) -> Plan:
    """The plan once the final ran ``seeds`` seeds: the :func:`autoln.race.rule.horizon_jobs`
    not yet measured pending, else done (each horizon a rung of the history)."""
    jobs = horizon_jobs(finalists, values, full_steps, rule, seeds)
    for k in sorted({j.steps for j in jobs}):
        history.append({"steps": k, "entries": list(dict.fromkeys(j.entry for j in jobs if j.steps == k)),
                        "seeds": rule.final_seeds, "horizon": k // full_steps})
    missing = [j for j in jobs if j.key not in values]
    if missing:
        return Plan(missing, history, proposed=proposed)
    return Plan([], history, done=True, finalists=finalists, seeds=seeds, proposed=proposed)


def most_steps(entries: Sequence[Entry], full_steps: int, rule: RaceRule) -> int:
    """The most retrain steps :func:`plan` can run over ``entries``: the searched entries'
    rounds (:func:`searched_steps`), every named placement at ``full_steps``, each final seed of
    at most three finalists (the best named one, the model's own, the searched one; with no
    searched entry the two best named ones) up to ``max_seeds`` (``final_seeds`` without a
    searched entry), no final cut short, and the horizons. E.g. 5 searched and 5 named entries at
    ``(1000, eta 3, 3 rungs, 6 seeds at most)``: ``5 * 111 + 2 * 333 + 6 * 1000 + 2 * 5 * 1000 =
    17221``. The bound behind a race's time-left estimate (:class:`autoln.engine.training.TimeLeft`).

    Raises:
        ValueError: as :func:`autoln.race.rule.rung_steps`."""
    first = sum(not e.named for e in entries)
    named = sum(e.named for e in entries)
    searched = 1 if first or rule.proposer != "none" else 0
    both = bool(named and searched)
    seeds = rule.max_seeds if both else rule.final_seeds
    horizons = 2 * rule.final_seeds * full_steps * sum(rule.horizons[1:]) if both else 0
    if rule.proposer == "none" and (len(entries) <= 3 or len(rung_steps(full_steps, rule)) == 1):
        return len(entries) * full_steps * seeds + horizons
    finalists = searched + min(named, 2)
    return searched_steps(first, full_steps, rule) + named * full_steps \
        + finalists * ((seeds if searched else rule.final_seeds) - 1) * full_steps + horizons


def steps_done(values: Values) -> int:
    """The retrain steps behind ``values`` (``(entry, steps, seed)`` -> value): the race's work
    so far, in the units of :func:`most_steps`."""
    return sum(k[1] for k in values)


def run(entries: Sequence[Entry], full_steps: int, rule: RaceRule, measure: Callable[[Job], float],
        values: Optional[dict] = None, propose: Optional[Propose] = None) -> tuple[Plan, dict]:
    """Run the race in this process: measure every pending job of :func:`plan` in order until
    it is done. ``measure(job)`` retrains and returns the value (NaN for a diverged run);
    ``values`` holds measurements already made (reused, and filled in). Returns the final
    :class:`Plan` and the values.

    Raises:
        ValueError: as :func:`plan`."""
    values = {} if values is None else values
    while True:
        p = plan(entries, values, full_steps, rule, propose)
        if p.done:
            return p, values
        for job in p.pending:
            values[job.key] = float(measure(job))
