"""Random search through the same race at equal wall time, replayed from the retrain table
(issue 43, "against random search"; NAS-Bench-201's way of evaluating black-box methods).

Per setting and space (e.g. ``shallow`` over the seven candidates): each simulated run draws the
table's sampled random genotypes (those of ``experiments/ground_truth.py``, seed-0 rows at the
full budget) in a random order (``numpy.random.default_rng([seed, run])``), enters the first
``N`` with the named placements into the race of :mod:`autoln.race` (the rule of ``search.py``'s
race, run on the table's rows instead of retraining), with ``N`` the largest whose race costs no
more wall time (the rows' ``wall_time_s``) than the searched races' mean cost, search included
(``experiments/races.csv``). It reports how often the searched race's answer beats the random
race's answer, over the pairs (search seed, simulated run), by their mean valid over the race's
seeds at the full budget (lower wins; a tie counts half).

A run needs rows the table may not hold yet (a genotype at a short rung, or a finalist at seeds 1
and 2): ``--fill`` retrains the missing ones of the first ``--fill`` runs (a real run of random
search, which checks the simulation) and records them; without it the report names how many
rows are missing and leaves those runs out::

    OMP_NUM_THREADS=1 python experiments/race_replay.py --data $D --settings shallow --set "$C" [--runs 500] [--fill 1]
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from race import RACES, TableRetrains  # noqa: E402
from retrain_table import read_table  # noqa: E402
from validate import add_common_arguments, base_overrides, parse_settings, setting_config  # noqa: E402

from autoln.cli import OneLineParser, guarded  # noqa: E402
from autoln.race import REVISION  # noqa: E402


class Missing(Exception):
    """A row the replay needs is not in the table."""


def searched_races(path: Path, setting: str, space: str) -> list[dict]:
    """The searched races of ``setting``/``space`` in ``experiments/races.csv`` run by today's rule."""
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if (r["setting"], r["space"], r["rule"]) == (setting, space, REVISION)]


def replay(name: str, overrides: list[str], args) -> str:
    """The report of one setting (module docstring)."""
    from autoln import race as R
    from autoln.data import load_corpus
    from autoln.genotype import baseline
    from autoln.run_race import job_config, named_specs, rule_of

    cfg = setting_config(name, overrides, args.config)
    space = "+".join(cfg.model.searched_candidates())
    corpus = load_corpus(cfg.data)
    full, rule = cfg.retrain.steps, rule_of(cfg)
    rows = read_table(args.table)
    sample = sorted({r.genotype for r in rows if (r.setting, r.space, r.seed, r.steps) == (name, space, cfg.retrain.seed, full)})
    named = {n: baseline(n, cfg.model, corpus.vocab_size).describe() for n in named_specs(cfg.model.searched_candidates())}
    sample = [g for g in sample if g not in named.values()]
    races = searched_races(args.races, name, space)
    if not races or not sample:
        return f"{name}/{space}: needs searched races in {args.races} ({len(races)}) and sampled genotypes in the table ({len(sample)})"
    budget = statistics.mean(float(r["search_s"]) + float(r["race_s"]) for r in races)
    folder = Path(args.out) / name / "race-replay"
    retrains = TableRetrains(name, space, args.table, folder, corpus.fingerprint)

    def measure_with(fill: bool):
        def measure(job) -> float:
            placements = named.get(job.entry) or job.entry
            jcfg = job_config(cfg, job)
            row = retrains.find(jcfg, placements)
            if row is not None:
                retrains.wall[(placements, jcfg.retrain.seed, job.steps)] = row.wall_time_s
                return row.valid
            if not fill:
                raise Missing(job.key)
            spec = job.entry if job.entry in named else str(write_genotype(cfg, corpus.vocab_size, placements, folder))
            return retrains.value(jcfg, job.entry, spec, placements, folder / placements.replace(" ", "_") / f"steps{job.steps}-seed{job.seed}")
        return measure

    def cost(values: dict) -> float:
        return sum(retrains.wall.get((named.get(e) or e, cfg.retrain.seed + i, s), 0.0) for (e, s, i) in values)

    wins, missing = [], 0
    for run in range(args.runs):
        order = [sample[int(i)] for i in np.random.default_rng([args.seed, run]).permutation(len(sample))]
        best = None
        for n in range(1, len(order) + 1):  # the largest pool whose race fits the budget (at least one genotype)
            entries, _ = R.make_pool([(g, g) for g in order[:n]], list(named.items()))
            try:
                plan, values = R.run(entries, full, rule, measure_with(run < args.fill))
            except Missing:
                best = None
                break
            if best is not None and cost(values) > budget:
                break
            best = (plan, values)
        if best is None:
            missing += 1
            continue
        plan, values = best
        v = R.verdict(plan.finalists, values, full, rule)
        try:  # each answer's worth: its mean over the race's seeds at the full budget (a curtailed final ran seed 0 alone)
            measure = measure_with(run < args.fill)
            random_value = statistics.mean(measure(R.Job(v.answer.name, full, i)) for i in range(rule.final_seeds))
            searched_values = [statistics.mean(measure(R.Job(next((n for n, g in named.items() if g == r["answer_placements"]),
                                                                  r["answer_placements"]), full, i))
                                               for i in range(rule.final_seeds)) for r in races]
        except Missing:
            missing += 1
            continue
        for searched in searched_values:
            wins.append(1.0 if searched < random_value else 0.5 if searched == random_value else 0.0)
    share = 100 * statistics.mean(wins) if wins else float("nan")
    return (f"{name}/{space}: budget {budget:.0f} s (the searched races' mean, search included); {len(races)} searched races, "
            f"{args.runs} simulated runs of random search through the race ({missing} left out for rows the table lacks); "
            f"the searched answer beats random search's in {share:.1f} % of {len(wins)} pairs (aim: 80 %)")


def write_genotype(cfg, vocab: int, placements: str, folder: Path) -> Path:
    """A genotype file of ``placements`` (one per block) in ``folder/pool``."""
    from autoln.genotype import from_probabilities

    cands = cfg.model.searched_candidates()
    names = placements.split()
    path = folder / "pool" / f"{placements.replace(' ', '_')}.json"
    if not path.exists():
        from_probabilities(np.eye(len(cands))[[cands.index(p) for p in names]], cfg.model, vocab, {"race_replay": True},
                           [cands.index(p) for p in names]).save(path)
    return path


def main(argv=None) -> int:
    p = OneLineParser(prog="race_replay.py", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, "shallow")
    p.add_argument("--runs", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fill", type=int, default=0, help="retrain the missing rows of the first N runs (a real run)")
    p.add_argument("--races", type=Path, default=RACES)
    args = p.parse_args(argv)

    def body() -> None:
        for name in parse_settings(args.settings):
            print(replay(name, base_overrides(args), args), flush=True)

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
