"""``autoln.race_genotypes``: the race of ``search.py`` on a user's model (docs/design.md §10;
the rule: :mod:`autoln.race.rule`).

A search's answer (its read-off, its argmax and its shortlist) against the named placements
(:func:`named_site_genotypes`) and the model's own placement, decided by real trainings: each
retrain as :func:`autoln.compare_genotypes` runs one (:mod:`autoln.api.comparing`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from autoln.api.comparing import RunProgress, check_before_training, uniform
from autoln.api.deriving import derive
from autoln.api.site_genotype import SiteGenotype, as_site_genotype
from autoln.api.sites import (as_number, check_build, check_names, plain_qk_choices, qk_one_hot, searchable_qk_norms,
                              searchable_sites)
from autoln.space.qk import QK_NAMED, named_qk


def named_site_genotypes(model: nn.Module) -> dict[str, SiteGenotype]:
    """The named placements of ``model``'s searchable sites: ``all-<c>`` for each candidate and,
    when ``pre`` and ``post`` are candidates, ``mix-ln`` (the sites of the first
    ``floor(0.25 N + 0.5)`` blocks ``post``, the rest ``pre``; Li et al. 2024) and ``pre-post``
    (the first ``floor(0.5 N + 0.5)`` blocks ``pre``, the rest ``post``), ``N`` the sites'
    ``n_layers`` and the block a site's ``layer``; where the model has searched
    :class:`autoln.QKNorm` s, these take none (:func:`autoln.api.sites.plain_qk_choices`), and
    ``olmo2``, ``gemma3``, ``qwen3`` join where their parts are candidates
    (:data:`autoln.space.qk.QK_NAMED`).

    Raises:
        ValueError: no searchable site."""
    from autoln.models.genotype import named_blocks

    sites = searchable_sites(model)
    if not sites:
        raise ValueError("autoln.race_genotypes: build() gives a model without an autoln.Site of two or more candidates")
    cands = list(sites[0][1].placements)
    plain = plain_qk_choices(model)
    out = {f"all-{c}": uniform(model, c) for c in cands}
    if "pre" in cands and "post" in cands:
        for name in ("mix-ln", "pre-post"):
            blocks = named_blocks(name, sites[0][1].n_layers)
            chosen = {s: blocks[site.layer - 1] for s, site in sites}
            out[name] = SiteGenotype(cands, chosen, {s: [1.0 if c == chosen[s] else 0.0 for c in cands] for s in chosen}, {},
                                     *plain)
    qks = searchable_qk_norms(model)
    for name in QK_NAMED:  # the open models' pairings, where their placement and QK-norm are candidates
        pair = named_qk(name, cands, qks[0][1].candidates) if qks else None
        if pair is not None:
            g = uniform(model, pair[0])
            out[name] = replace(g, **dict(zip(("qk", "qk_candidates", "qk_probabilities"),
                                              qk_one_hot({n: pair[1] for n, _ in qks}, qks[0][1].candidates))))
    return out


def searched_site_genotypes(genotype: SiteGenotype) -> dict[str, SiteGenotype]:
    """What a search's answer enters into the race: ``read-off`` (the genotype), ``argmax`` (of
    its probabilities) and ``top1``... (its provenance's ``shortlist``, :func:`autoln.search`)."""
    cands = genotype.candidates

    def one_hot(sites: dict[str, str], name: str) -> SiteGenotype:  # with the read-off's QK-norm choice
        return SiteGenotype(list(cands), dict(sites), {s: [1.0 if c == p else 0.0 for c in cands] for s, p in sites.items()},
                            {"race_entry": name}, dict(genotype.qk), list(genotype.qk_candidates),
                            dict(genotype.qk_probabilities))

    out = {"read-off": genotype,
           "argmax": one_hot({s: cands[max(range(len(p)), key=p.__getitem__)] for s, p in genotype.probabilities.items()}, "argmax")}
    for i, entry in enumerate(genotype.provenance.get("shortlist", [])):
        out[f"top{i + 1}"] = one_hot(entry["sites"], f"top{i + 1}")
    return out


@dataclass
class RaceOutcome:
    """What :func:`race_genotypes` returns: ``genotype`` (the answer, the verdict in its
    provenance's ``race``), the :class:`autoln.race.verdict.Verdict`, the final :class:`autoln.race.rule.Plan`,
    every measured ``values`` (``(entry, steps, seed index)`` -> value) and ``record`` (as
    ``search.py``'s ``race.json``: rule, pool, rungs, retrains, verdict)."""

    genotype: SiteGenotype
    verdict: Any
    plan: Any
    values: dict
    record: dict


def race_genotypes(build: Callable[[], nn.Module], searched: Union[SiteGenotype, Mapping[str, SiteGenotype]], *,
                   train: Callable[[nn.Module, int, int], Any], evaluate: Callable[[nn.Module], float], steps: int,
                   own: Union[str, SiteGenotype] = "pre", baselines: Optional[Sequence[str]] = None, seed: int = 0,
                   rule: Any = None, values: Optional[dict] = None, on_result: Optional[Callable[[Any, float], None]] = None,
                   progress: bool = True, unit: str = "nats/token") -> RaceOutcome:
    """The race of ``search.py`` on a user's model (docs/design.md §10; the rule is
    :mod:`autoln.race.rule`): the search's shortlist against the named placements and the model's
    own placement, decided by real trainings: successive halving of the searched genotypes
    ending at ``steps``, every named placement at ``steps`` (seed 0), the finalists seed by seed,
    ``rule.final_seeds`` to ``rule.max_seeds`` seeds, until the group-sequential final ends
    (:mod:`autoln.race.sequential`; at seed 0 when the searched one is behind there).

    Per retrain, in this order: ``torch.manual_seed(seed + i)``, ``model = build()``,
    ``derive(model, genotype)``, ``train(model, seed + i, rung_steps)``, ``evaluate(model)``
    (``i`` the seed index: 0 at the short rungs and the named placements' first run,
    ``0..max_seeds-1`` at most in the final at ``steps``).

    Args:
        build: ``() -> nn.Module``, a fresh model with the searched sites.
        searched: the search's answer (:attr:`autoln.SearchOutcome.genotype`: its read-off, its
            argmax and its ``shortlist`` enter), or ``{name: genotype}`` entered as they are.
        train: ``fn(model, seed, steps)``: trains the model in place for ``steps`` steps (your
            loop at that length, e.g. its schedule ending at ``steps``).
        evaluate: ``fn(model) -> float``, lower is better (a validation loss).
        steps: the full budget (the training you will run), the last rung.
        own: the model's own placement, always a finalist: a candidate name (every site), or a
            :class:`autoln.SiteGenotype`. Default ``pre`` (GPT-2, nanoGPT, Llama).
        baselines: names of :func:`named_site_genotypes` to race (default all of them).
        seed: the first seed.
        rule: an :class:`autoln.race.rule.RaceRule` (default eta 3, 3 rungs, 3 to 6 final seeds, level
            0.05; ``proposer``: proposal rounds after the shortlist's, :mod:`autoln.race.schedule`,
            the prior ``searched``'s probabilities; ``random``: random genotypes instead of the
            shortlist).
        values: measurements already made (``(entry, steps, seed index)`` -> value), reused and
            filled in: a race continued after an interruption, or replayed.
        on_result: ``fn(job, value)`` after each retrain (e.g. to keep it in a table).
        progress: on stderr the pool, then a tqdm bar over the race's most retrain steps
            (:func:`autoln.race.rule.most_steps`) on a terminal, or a line per retrain with the
            estimated time left at most in a redirected log (:class:`RunProgress`), and the
            verdict.
        unit: the unit of ``evaluate``'s value, printed after every number (default
            ``nats/token``).

    Returns:
        :class:`RaceOutcome`.

    Raises:
        ValueError: ``steps`` not a positive integer, ``searched`` not a genotype, a mapping of
            genotypes or a genotype file, an ``own`` that is not a candidate, ``baselines`` not a
            list of known names, ``rule`` not a RaceRule, ``values`` not keyed ``(entry, steps,
            seed index)``, ``evaluate`` returning something other than a number (its trial call
            before training may raise: :func:`check_before_training`); as :func:`named_site_genotypes`.
        autoln.core.errors.GenotypeError: a genotype that does not fit the model (:func:`derive`),
            found before any training.
        autoln.core.errors.DivergenceError: every finalist diverged (:func:`autoln.race.verdict.verdict`).
    """
    from autoln.race import rule as R
    from autoln.race import schedule as S
    from autoln.race import verdict as V

    where = "autoln.race_genotypes"
    rule, baselines = check_race(build, train, evaluate, steps, on_result, rule, values, baselines)
    if not isinstance(searched, Mapping):
        searched = as_site_genotype(searched, f"{where}: searched")
    own_name, genotypes, pool_g, proposer = race_genotype_pool(build, searched, own, baselines, seed, rule)
    check_before_training(build, genotypes, evaluate, where)
    named = {k: g for k, g in genotypes.items() if k != own_name and k not in pool_g}
    entries, aliases = R.make_pool([(n, g.describe()) for n, g in pool_g.items()], [(n, g.describe()) for n, g in named.items()],
                                   own=(own_name, genotypes[own_name].describe()))
    if progress:
        print_pool(where, entries, aliases, steps, rule, not pool_g and proposer is None)
    shown = RunProgress(where, progress, S.most_steps(entries, steps, rule), "step", bound=True)
    shown.done = S.steps_done(values or {})

    def measure(job) -> float:
        torch.manual_seed(seed + job.seed)
        model = derive(build(), genotypes[job.entry])
        train(model, seed + job.seed, job.steps)
        value = as_number(evaluate(model), where)
        shown.finished(f"{job.entry} at {job.steps} steps, seed {seed + job.seed}: {value:.4f} {unit}", job.steps)
        if on_result is not None:
            on_result(job, value)
        return value

    shown.bar.time_left.start = shown.done
    shown.bar.update(shown.done)
    plan, values = run_entering(entries, steps, rule, measure, values, proposer, genotypes, proposal_like(genotypes[own_name], searched))
    shown.close()
    v = V.verdict(plan.finalists, values, steps, rule, unit, V.REMEDY_API)
    record = {"rule": rule.describe(), "full_steps": steps, "seed": seed, "aliases": aliases,
              "pool": [vars(e) | {"origin": R.origin(e)} for e in entries + plan.proposed], "rungs": plan.rungs, "jobs": [{"entry": k[0], "steps": k[1], "seed": seed + k[2], "value": val}
                                            for k, val in sorted(values.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0]))],
              "verdict": {"answer": v.answer.name, "outcome": v.outcome, "line": v.line, "p_value": v.p_value, "values": v.values,
                          "origin": R.origin(v.answer)}}
    chosen = genotypes[v.answer.name]
    answer = replace(chosen, sites=dict(chosen.sites), probabilities=dict(chosen.probabilities),  # its QK-norm choice kept
                     provenance={**chosen.provenance, "race": record["verdict"] | {"rule": record["rule"]}})
    if progress:
        print(f"{where}: {v.line}", file=sys.stderr, flush=True)
    return RaceOutcome(answer, v, plan, values, record)


def check_race(build, train, evaluate, steps, on_result, rule, values, baselines) -> tuple[Any, Optional[list[str]]]:
    """:func:`race_genotypes`' arguments checked: ``(rule, baselines)``, the rule defaulted.

    Raises:
        ValueError: as :func:`race_genotypes` says."""
    import numbers

    from autoln.race import rule as R


    where = "autoln.race_genotypes"
    check_build(build, where)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"{where}: steps: expected a positive integer, got {steps!r}")
    for what, fn in (("train", train), ("evaluate", evaluate), ("on_result", on_result)):
        if (fn is not None or what != "on_result") and not callable(fn):
            raise ValueError(f"{where}: {what}: expected a function, got a {type(fn).__name__}")
    if rule is not None and not isinstance(rule, R.RaceRule):
        raise ValueError(f"{where}: rule: expected an autoln.race.rule.RaceRule(eta=..., rungs=..., final_seeds=..., level=..., max_seeds=..., spending=...), "
                         f"got {type(rule).__name__}")
    baselines = check_names(baselines, f"{where}: baselines")
    if values is not None and (not isinstance(values, Mapping) or any(
            not (isinstance(k, tuple) and len(k) == 3 and isinstance(k[0], str) and isinstance(k[1], int) and isinstance(k[2], int))
            or isinstance(v, bool) or not isinstance(v, numbers.Real) for k, v in values.items())):
        raise ValueError(f"{where}: values: expected {{(entry name, steps, seed index): value}}, as RaceOutcome.values holds them")
    return rule or R.RaceRule(), baselines


def print_pool(where: str, entries, aliases: dict, steps: int, rule, no_searched: bool) -> None:
    """The race's pool, aliases and the rungs that will run (:func:`autoln.race.schedule.rungs_text`)
    in one line on stderr (a note first when ``no_searched``)."""
    from autoln.race.schedule import rungs_text

    if no_searched:
        print(f"{where}: note: no searched genotype: the race ranks the named placements only", file=sys.stderr)
    print(f"{where}: pool {', '.join(e.name for e in entries)}"
          + (f" (the same genotype: {', '.join(f'{a} = {b}' for a, b in aliases.items())})" if aliases else "")
          + f"; rungs: {rungs_text(entries, steps, rule)}",
          file=sys.stderr, flush=True)


def run_entering(entries, steps: int, rule, measure, values: Optional[dict], proposer, genotypes: dict, like: SiteGenotype):
    """:func:`autoln.race.schedule.run`, each proposed entry's genotype (the sites of ``like``)
    put into ``genotypes`` as it enters. Returns the final plan and the values."""
    from autoln.race import rule as R
    from autoln.race import schedule as S

    values = {} if values is None else values
    while True:
        plan = S.plan(entries, values, steps, rule, proposer)
        for e in plan.proposed:
            if e.name not in genotypes:
                genotypes[e.name] = SiteGenotype(like.candidates, dict(zip(like.sites, e.placements.partition(" | ")[0].split())), {},
                                                 {"race_entry": e.name, "origin": R.origin(e)}, dict(like.qk),
                                                 list(like.qk_candidates), dict(like.qk_probabilities))
        if plan.done:
            return plan, values
        for job in plan.pending:
            values[job.key] = float(measure(job))


def race_proposer(rule, own: SiteGenotype, searched: Optional[SiteGenotype], seed: int):
    """The proposer of ``rule.proposer`` over the sites and candidates of ``own`` (every race
    genotype has the same), the prior ``searched``'s final probabilities when it has them for
    every site (:mod:`autoln.race.propose`), every proposal with the QK-norm of ``searched``
    (else ``own``): :func:`proposal_like`; None for ``none``."""
    from autoln.race.propose import Space, make_proposer

    if rule.proposer == "none":
        return None
    prior = None
    if searched is not None and set(searched.probabilities) >= set(own.sites):
        prior = [list(searched.probabilities[k]) for k in own.sites]
    tail = proposal_like(own, searched).describe().partition(" | ")[2]  # its QK-norm part, empty without QK-norm
    return make_proposer(rule.proposer, Space(tuple(own.candidates), len(own.sites), prior, 1, tail), seed)


def proposal_like(own: SiteGenotype, searched: Any) -> SiteGenotype:
    """The genotype whose sites, candidates and QK-norm choices every proposed genotype takes (its
    placements its own): the search's answer where it is one :class:`SiteGenotype` over ``own``'s
    sites (as ``search.py``'s proposals take the read-off's QK-norm), else ``own``, the model's
    own placement."""
    return searched if isinstance(searched, SiteGenotype) and list(searched.sites) == list(own.sites) else own


def race_genotype_pool(build, searched, own, baselines, seed: int, rule) -> tuple[str, dict[str, SiteGenotype], dict[str, SiteGenotype], Any]:
    """The genotypes of :func:`race_genotypes`: ``(own's name, {name: genotype} with own first,
    then the named placements, then the searched ones, the searched ones, the proposer)``
    (:func:`race_proposer`; with ``random``, no searched genotype enters).

    Raises:
        ValueError: an unknown baseline, an ``own`` that is not a candidate nor a genotype."""
    where = "autoln.race_genotypes"
    torch.manual_seed(seed)
    probe = build()
    named = named_site_genotypes(probe)
    cands = list(searchable_sites(probe)[0][1].placements)
    del probe
    unknown = [b for b in (baselines or []) if b not in named]
    if unknown:
        raise ValueError(f"{where}: baselines: unknown {unknown}; expected some of {list(named)}")
    named = {k: v for k, v in named.items() if baselines is None or k in baselines}
    if isinstance(own, str):
        if own not in cands:
            raise ValueError(f"{where}: own: {own!r} is not among the sites' candidates {cands}")
        own_name, own_g = f"all-{own}", named.get(f"all-{own}") or uniform(build(), own)
    elif isinstance(own, SiteGenotype):
        own_name, own_g = "own", own
    else:
        raise ValueError(f"{where}: own: expected a candidate name or an autoln.SiteGenotype, got {type(own).__name__}")
    pool_g = searched_site_genotypes(searched) if isinstance(searched, SiteGenotype) else \
        {name: as_site_genotype(g, f"{where}: searched[{name!r}]") for name, g in searched.items()}
    named.pop(own_name, None)
    proposer = race_proposer(rule, own_g, searched if isinstance(searched, SiteGenotype) else None, seed)
    if rule.proposer == "random":  # random search through the same race: no searched entry
        pool_g = {}
    return own_name, {own_name: own_g, **named, **pool_g}, pool_g, proposer
