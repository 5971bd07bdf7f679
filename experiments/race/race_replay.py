"""Random search through the same race at equal wall time, replayed from the retrain table
(issue 43, "against random search"; NAS-Bench-201's way of evaluating black-box methods).

Per setting and space (e.g. ``shallow`` over the seven candidates): the random genotypes are
``experiments/truth/ground_truth.py``'s uniform sample (:func:`autoln.oneshot.fidelity.sample_genotypes`,
``--sample-seed`` 0, the drawn list's longest prefix with seed-0 rows at the full budget in the
table; the searched races' own genotypes never stand in for random ones). Each simulated run
draws them in a random order (``numpy.random.default_rng([seed, run])``) and enters the first
``N`` with the named placements into the race of :mod:`autoln.race.rule` (the rule of
``search.py``'s race, run on the table's rows instead of retraining), with ``N`` the largest
whose race costs no more wall time (the rows' ``wall_time_s``) than the searched races' mean
cost, search included (``experiments/races.csv``, today's rule only). It reports how often the
searched race's answer beats the random race's answer, over the pairs (search seed, simulated
run), by their mean valid over the race's seeds at the full budget (lower wins; a tie counts
half), and how many runs entered the whole sample (where the sample, not the budget, bounds N).

Rows the runs need and the table lacks: ``--prefill`` retrains every sampled genotype at every
short rung (seed 0) first; ``--fill N`` retrains what the first ``N`` runs still lack (a finalist
at seeds 1 and 2); without them the report says how many runs it left out. ``--check-run R``
then runs run ``R``'s race for real (``--check-named`` runs its named rung alone, ahead): every retrain from scratch, ``--workers`` at a time, its
rows kept apart in ``--check-table`` (``experiments/race_replay_check.csv``, so the simulation
never reads them and a stopped check resumes), and reports the real answer, cost and values
against the simulated ones::

    OMP_NUM_THREADS=1 python experiments/race/race_replay.py --data $D --settings shallow --set "$C" \\
        [--runs 500] [--prefill] [--fill 1] [--check-run 0] [--workers 2]
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
from experiments.race.race import RACES, TableRetrains  # noqa: E402
from experiments.common.retrain_table import append_rows, random_sample, read_table, row_from_run  # noqa: E402
from experiments.common.validate import add_common_arguments, base_overrides, parse_settings, setting_config  # noqa: E402

from autoln.cli import OneLineParser, guarded  # noqa: E402
from autoln.race.rule import REVISION  # noqa: E402

#: Where ``--check-run`` keeps its retrains (apart from ``retrains.csv``: the check must not feed the simulation).
CHECK_TABLE = Path(__file__).resolve().parents[1] / "race_replay_check.csv"


class Missing(Exception):
    """A row the replay needs is not in the table."""


def searched_races(path: Path, setting: str, space: str) -> list[dict]:
    """The searched races of ``setting``/``space`` in ``experiments/races.csv`` run by today's rule."""
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if (r["setting"], r["space"], r["rule"]) == (setting, space, REVISION)]


@dataclasses.dataclass
class Setup:
    """One setting's replay: its config, named placements (name -> placements), random sample
    (placements, in the order drawn), searched races, budget (s) and retrain table."""

    name: str
    space: str
    cfg: object
    vocab: int
    fingerprint: str
    named: dict
    sample: list
    races: list
    budget: float
    folder: Path
    retrains: TableRetrains

    def placements(self, entry: str) -> str:
        """The placements string of a race entry (a named placement's name, else its placements)."""
        return self.named.get(entry) or entry


def setup_of(name: str, overrides: list[str], args) -> Setup | str:
    """The :class:`Setup` of ``name``, or the line saying what it lacks."""
    from autoln.data import load_corpus
    from autoln.models.genotype import baseline
    from autoln.race.run_race import named_specs

    cfg = setting_config(name, overrides, args.config)
    cands = cfg.model.searched_candidates()
    space = "+".join(cands)
    corpus = load_corpus(cfg.data)
    full = cfg.retrain.steps
    have = {r.genotype for r in read_table(args.table)
            if (r.setting, r.space, r.seed, r.steps) == (name, space, cfg.retrain.seed, full)}
    sample = random_sample(have, cands, cfg.model.n_layers, args.sample_seed)
    named = {n: baseline(n, cfg.model, corpus.vocab_size).describe() for n in named_specs(cands)}
    races = searched_races(args.races, name, space)
    if not races or not sample:
        return f"{name}/{space}: needs searched races in {args.races} ({len(races)}) and sampled genotypes in the table ({len(sample)})"
    budget = statistics.mean(float(r["search_s"]) + float(r["race_s"]) for r in races)
    folder = Path(args.out) / name / "race-replay"
    return Setup(name, space, cfg, corpus.vocab_size, corpus.fingerprint, named, sample, races, budget, folder,
                 TableRetrains(name, space, args.table, folder, corpus.fingerprint))


def task_of(s: Setup, job, folder: Path) -> tuple:
    """The arguments of :func:`retrain_task` for ``job`` (an :class:`autoln.race.rule.Job`)."""
    from autoln.race.run_race import job_config

    placements = s.placements(job.entry)
    spec = job.entry if job.entry in s.named else str(write_genotype(s.cfg, s.vocab, placements, folder))
    run_dir = folder / placements.replace(" ", "_") / f"steps{job.steps}-seed{job.seed}"
    return (job_config(s.cfg, job), job.entry, spec, s.name, s.space, str(run_dir))


def retrain_task(cfg, label: str, spec: str, setting: str, space: str, run_dir: str):
    """One retrain in a worker process (one torch thread); its table row, or None (diverged)."""
    from autoln.retrain.compare import retrain_one

    from experiments.common.retrain_table import current_commit

    if retrain_one(cfg, label, spec, run_dir, False, 1) is None:
        return None
    return row_from_run(Path(run_dir), setting, space, current_commit())


def run_tasks(tasks: list[tuple], table: Path, workers: int) -> list:
    """Run ``tasks`` (:func:`task_of`), ``workers`` at a time, each finished row appended to
    ``table`` at once (a stopped run keeps what finished); the rows in ``tasks``' order."""
    if not tasks:
        return []
    if workers == 1:
        rows = [retrain_task(*t) for t in tasks]
        append_rows([r for r in rows if r is not None], table)
        return rows
    import multiprocessing

    rows = [None] * len(tasks)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as ex:
        futures = {ex.submit(retrain_task, *t): i for i, t in enumerate(tasks)}
        for f in as_completed(futures):
            rows[futures[f]] = f.result()
            if rows[futures[f]] is not None:
                append_rows([rows[futures[f]]], table)
    return rows


def measure_with(s: Setup, fill: bool):
    """``measure(job) -> valid`` from the table (its wall time noted), retraining a missing row
    when ``fill``, else raising :class:`Missing`."""
    from autoln.race.run_race import job_config

    def measure(job) -> float:
        placements = s.placements(job.entry)
        jcfg = job_config(s.cfg, job)
        row = s.retrains.find(jcfg, placements)
        if row is not None:
            s.retrains.wall[(placements, jcfg.retrain.seed, job.steps)] = row.wall_time_s
            return row.valid
        if not fill:
            raise Missing(job.key)
        cfg, label, spec, _, _, run_dir = task_of(s, job, s.folder)
        return s.retrains.value(cfg, label, spec, placements, Path(run_dir))
    return measure


def cost(s: Setup, values: dict) -> float:
    """Wall time (s) of the retrains behind ``values`` (the table rows' ``wall_time_s``)."""
    return sum(s.retrains.wall.get((s.placements(e), s.cfg.retrain.seed + i, st), 0.0) for (e, st, i) in values)


def simulate(s: Setup, run: int, seed: int, fill: bool):
    """Run ``run`` of random search: ``(entries, plan, values, n)`` of the largest pool whose race
    fits the budget (at least one random genotype), ``n`` the random genotypes entered.

    Raises:
        Missing: a row the run needs is not in the table (and not ``fill``)."""
    from autoln.race import rule as R
    from autoln.race import schedule as S
    from autoln.race.run_race import rule_of

    full, rule = s.cfg.retrain.steps, rule_of(s.cfg)
    order = [s.sample[int(i)] for i in np.random.default_rng([seed, run]).permutation(len(s.sample))]
    best = None
    for n in range(1, len(order) + 1):
        entries, _ = R.make_pool([(g, g) for g in order[:n]], list(s.named.items()))
        plan, values = S.run(entries, full, rule, measure_with(s, fill))
        if best is not None and cost(s, values) > s.budget:
            break
        best = (entries, plan, values, n)
    return best


def answer_worth(s: Setup, entry: str, fill: bool) -> float:
    """An answer's mean valid over the race's seeds at the full budget (a curtailed final ran
    seed 0 alone, so this may need seeds the race did not run).

    Raises:
        Missing: as :func:`simulate`."""
    from autoln.race import rule as R
    from autoln.race.run_race import rule_of

    measure = measure_with(s, fill)
    return statistics.mean(measure(R.Job(entry, s.cfg.retrain.steps, i)) for i in range(rule_of(s.cfg).final_seeds))


def replay(s: Setup, args) -> str:
    """The report of one setting (module docstring)."""
    from autoln.race import verdict as V
    from autoln.race.run_race import rule_of

    full, rule = s.cfg.retrain.steps, rule_of(s.cfg)
    searched = [next((n for n, g in s.named.items() if g == r["answer_placements"]), r["answer_placements"]) for r in s.races]
    wins, missing, sizes, answers, random_values = [], 0, [], {}, []
    for run in range(args.runs):
        fill = run < args.fill
        try:
            entries, plan, values, n = simulate(s, run, args.seed, fill)
            v = V.verdict(plan.finalists, values, full, rule)
            random_value = answer_worth(s, v.answer.name, fill)
            searched_values = [answer_worth(s, e, fill) for e in searched]  # the same in every run
        except Missing:
            missing += 1
            continue
        sizes.append(n)
        answers[v.answer.name] = answers.get(v.answer.name, 0) + 1
        for i, value in enumerate(searched_values):
            wins.append((i, 1.0 if value < random_value else 0.5 if value == random_value else 0.0))
        random_values.append(random_value)
    share = 100 * statistics.mean(w for _, w in wins) if wins else float("nan")
    by_race = ", ".join(f"search seed {r.get('search_seed', i)} ({searched[i]}, {searched_values[i]:.4f}) "
                        f"{100 * statistics.mean(w for j, w in wins if j == i):.1f} %" for i, r in enumerate(s.races)) if wins else ""
    spread = (f"random search's answers: mean {statistics.mean(random_values):.4f}, median {statistics.median(random_values):.4f}, "
              f"{min(random_values):.4f}-{max(random_values):.4f}; ") if random_values else ""
    top = ", ".join(f"{a} {k}" for a, k in sorted(answers.items(), key=lambda x: -x[1])[:4])
    whole = sum(n == len(s.sample) for n in sizes)
    return (f"{s.name}/{s.space}: budget {s.budget:.0f} s (the searched races' mean, search included); {len(s.races)} searched "
            f"races (answers: {', '.join(searched)}); {args.runs} simulated runs of random search through the race over "
            f"{len(s.sample)} sampled genotypes ({missing} left out for rows the table lacks); random genotypes entered per run: "
            f"median {statistics.median(sizes) if sizes else float('nan'):.0f}, {min(sizes, default=0)}-{max(sizes, default=0)}, "
            f"the whole sample in {whole}; random search's answers: {top}; "
            f"{spread}the searched answer beats random search's in {share:.1f} % of {len(wins)} pairs (aim: 80 %; by search "
            f"race, its answer and mean valid over the race's seeds: {by_race})")


def prefill(s: Setup, args) -> str:
    """Retrain every sampled genotype at every short rung (seed 0) the table lacks."""
    from autoln.race import rule as R
    from autoln.race.run_race import job_config, rule_of

    tasks = []
    for steps in R.rung_steps(s.cfg.retrain.steps, rule_of(s.cfg))[:-1]:
        for g in s.sample:
            job = R.Job(g, steps, 0)
            if s.retrains.find(job_config(s.cfg, job), g) is None:
                tasks.append(task_of(s, job, s.folder))
    rows = run_tasks(tasks, args.table, args.workers)
    s.retrains.rows = read_table(args.table)
    return f"{s.name}/{s.space}: prefill retrained {len(rows)} short-rung rows ({sum(r is None for r in rows)} diverged)"


def check_retrains(s: Setup, args) -> tuple[Path, TableRetrains]:
    """The real check's run folder and its retrains, kept in ``--check-table`` (module docstring)."""
    folder = Path(args.out) / s.name / f"race-replay-check{args.check_run}"
    return folder, TableRetrains(s.name, s.space, args.check_table, folder, s.fingerprint)


def check_named(s: Setup, args) -> str:
    """The real check's named rung ahead of it: every named placement at the full budget, seed 0,
    into ``--check-table`` (every race runs it, whatever the draw; it needs no simulation, so it
    can run while ``--prefill`` does)."""
    from autoln.race import rule as R
    from autoln.race.run_race import job_config

    folder, real = check_retrains(s, args)
    jobs = [R.Job(n, s.cfg.retrain.steps, 0) for n in s.named]
    run = [j for j in jobs if real.find(job_config(s.cfg, j), s.named[j.entry]) is None]
    rows = run_tasks([task_of(s, j, folder) for j in run], args.check_table, args.workers)
    return f"{s.name}/{s.space}: the check's named rung: {len(rows)} retrained, {len(jobs) - len(run)} there already"


def check_run(s: Setup, args) -> str:
    """Run ``args.check_run``'s race for real (module docstring) and compare it with the simulation."""
    from autoln.race import schedule as S
    from autoln.race import verdict as V
    from autoln.race.run_race import job_config, rule_of

    full, rule = s.cfg.retrain.steps, rule_of(s.cfg)
    entries, sim_plan, sim_values, n = simulate(s, args.check_run, args.seed, False)
    sim = V.verdict(sim_plan.finalists, sim_values, full, rule)
    folder, real = check_retrains(s, args)
    values: dict = {}
    t0 = time.perf_counter()
    while True:
        plan = S.plan(entries, values, full, rule)
        if plan.done:
            break
        todo = plan.pending  # none measured yet (autoln.race.rule.Plan)
        found = {j.key: real.find(job_config(s.cfg, j), s.placements(j.entry)) for j in todo}
        run = [j for j in todo if found[j.key] is None]
        for j, row in zip(run, run_tasks([task_of(s, j, folder) for j in run], args.check_table, args.workers)):
            found[j.key] = row
        for j in todo:
            row = found[j.key]
            values[j.key] = float("inf") if row is None else row.valid
            real.wall[(s.placements(j.entry), s.cfg.retrain.seed + j.seed, j.steps)] = row.wall_time_s if row else 0.0
    wall = time.perf_counter() - t0
    v = V.verdict(plan.finalists, values, full, rule)
    real_cost = sum(real.wall.values())
    shared = [k for k in values if k in sim_values]
    diff = max((abs(values[k] - sim_values[k]) for k in shared), default=float("nan"))
    return (f"{s.name}/{s.space}: check of run {args.check_run} ({n} random genotypes entered): real answer {v.answer.name} "
            f"({v.line}); simulated answer {sim.answer.name}; {'the same' if v.answer.name == sim.answer.name else 'DIFFERENT'}; "
            f"{len(values)} real retrains against {len(sim_values)} simulated, {len(shared)} in both, their valid values differ "
            f"by at most {diff:.4f}; cost: {real_cost:.0f} s of retrains real (this call's wall {wall:.0f} s with "
            f"{args.workers} workers), {cost(s, sim_values):.0f} s simulated, budget {s.budget:.0f} s")


def write_genotype(cfg, vocab: int, placements: str, folder: Path) -> Path:
    """A genotype file of ``placements`` (one per block) in ``folder/pool``."""
    from autoln.models.genotype import from_probabilities

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
    p.add_argument("--sample-seed", type=int, default=0, help="ground_truth.py's sample (its --sample-seed)")
    p.add_argument("--prefill", action="store_true", help="first retrain the sample at every short rung the table lacks")
    p.add_argument("--fill", type=int, default=0, help="retrain the missing rows of the first N runs")
    p.add_argument("--check-run", type=int, default=None, metavar="R", help="then run run R's race for real")
    p.add_argument("--check-table", type=Path, default=CHECK_TABLE)
    p.add_argument("--check-named", action="store_true", help="only run the check's named rung (no simulation needed)")
    p.add_argument("--races", type=Path, default=RACES)
    args = p.parse_args(argv)
    if args.check_named and args.check_run is None:
        p.error("--check-named: needs --check-run R (the run whose check it prepares)")

    def body() -> None:
        for name in parse_settings(args.settings):
            s = setup_of(name, base_overrides(args), args)
            if isinstance(s, str):
                print(s, flush=True)
                continue
            if args.check_named:
                print(check_named(s, args), flush=True)
                continue
            if args.prefill:
                print(prefill(s, args), flush=True)
            print(replay(s, args), flush=True)
            if args.check_run is not None:
                print(check_run(s, args), flush=True)

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
