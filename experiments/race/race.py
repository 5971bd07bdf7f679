"""The race in autoln's own model (issue 43): ``search.py``'s search and race per setting of
``experiments/common/validate.py``, every retrain a row of ``experiments/retrains.csv``, and the answer
against the best named placement at fresh seeds.

Per setting (``shallow``, ``highlr``, ``deep``), candidate set (``3``: pre post deepnorm; ``7``:
the seven) and search seed ``s``:

1. the default search with ``search.seed = s`` in ``<out>/<setting>/race<K>/search-seed<s>``
   (reused when finished, resumed when interrupted), its shortlist scored as ``search.py`` does;
2. the race of ``search.py`` (:mod:`autoln.race.rule`'s rule over :func:`autoln.race.run_race.race_pool`'s
   pool, each retrain :func:`autoln.race.run_race.job_config`'s: the ``retrain`` settings at the
   rung's length, seeds ``retrain.seed + 0, 1, 2``), in process, each retrain read from the
   table when it holds it (any space: a retrain is its genotype, seed, steps and config) and
   otherwise run in ``<search>/race/<entry>/steps<S>-seed<i>`` and added to the table;
3. the answer and the two best named placements at the race's seed 0 (every named placement runs
   there at the full budget) retrained at the fresh seeds ``--fresh-seeds`` (seed indices,
   default 6, 7, 8: past every seed the sequential final can use; rule r2's rows used 3, 4, 5); the best named placement is the better of the two there.

One row per race goes to ``experiments/races.csv`` (the verdict, the answer, the wall times of
the search and of the race's retrains, the fresh seeds' values)::

    OMP_NUM_THREADS=1 python experiments/race/race.py --data WIKITEXT_FOLDER --settings shallow,highlr --candidates 3,7 --search-seeds 0
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
from experiments.common.retrain_table import Row, append_rows, config_id, current_commit, read_table, row_from_run  # noqa: E402
from experiments.common.validate import add_common_arguments, base_overrides, parse_settings, setting_config  # noqa: E402

from autoln.cli import OneLineParser, guarded  # noqa: E402
from autoln.core.io import append_csv_row  # noqa: E402
from autoln.race.rule import REVISION, RaceRule  # noqa: E402

SEVEN = "[pre, post, deepnorm, peri, outnorm, lns, none]"
CANDIDATES = {"3": [], "7": [f"model.candidates={SEVEN}"]}
RACES = Path(__file__).resolve().parents[1] / "races.csv"
FIELDS = ["setting", "space", "search_seed", "rule", "read_off", "answer", "answer_placements", "outcome", "p_value", "verdict",
          "search_s", "race_retrains", "race_s", "fresh_seeds", "fresh_answer", "best_named", "fresh_best_named", "commit"]


class TableRetrains:
    """The race's retrains of one setting: read from the retrain table, else run and recorded."""

    def __init__(self, setting: str, space: str, table: Path, folder: Path, corpus_fingerprint: str) -> None:
        self.setting, self.space, self.table, self.folder = setting, space, table, folder
        self.fingerprint = corpus_fingerprint
        self.commit = current_commit()
        self.rows = read_table(table) if table is not None else []
        self.wall: dict = {}

    def find(self, cfg, placements: str) -> Row | None:
        """The table's row of this retrain (any space), or None."""
        cid = config_id(cfg.to_dict(), self.fingerprint)
        rc = cfg.retrain
        for r in self.rows:
            if (r.setting, r.genotype, r.seed, r.steps, r.windows, r.config) == (self.setting, placements, rc.seed, rc.steps,
                                                                                 rc.final_eval_windows, cid):
                return r
        return None

    def value(self, cfg, name: str, spec: str, placements: str, run_dir: Path) -> float:
        """Valid bits per byte of the retrain (``inf`` when it diverged)."""
        from autoln.retrain.compare import retrain_one

        row = self.find(cfg, placements)
        if row is None:
            metrics = retrain_one(cfg, name, spec, str(run_dir), False, None)
            if metrics is None:
                return math.inf
            row = row_from_run(run_dir, self.setting, self.space, self.commit)
            if row is None:
                return math.inf
            if self.table is not None:
                append_rows([row], self.table)
            self.rows.append(row)
            print(f"[race] {self.setting} {name} seed {cfg.retrain.seed} at {cfg.retrain.steps} steps: {row.valid:.4f} "
                  f"({row.wall_time_s:.0f} s)", file=sys.stderr, flush=True)
        self.wall[(placements, cfg.retrain.seed, cfg.retrain.steps)] = row.wall_time_s
        return row.valid


def search(cfg, folder: Path):
    """The search in ``folder``: reused when finished, resumed when interrupted, else run (its
    shortlist scored: ``race.enabled`` is on). Returns its :class:`autoln.models.genotype.Genotype`."""
    from autoln.oneshot.consensus import check_same_search
    from autoln.models.genotype import Genotype
    from autoln.oneshot.run_search import run_search

    if (folder / "genotype.json").exists():
        check_same_search(folder, cfg)
        return Genotype.load(folder / "genotype.json")
    resume = (folder / "checkpoint.pt").exists()
    print(f"[race] search -> {folder}", file=sys.stderr, flush=True)
    return run_search(cfg, folder, overwrite=not resume, resume=resume).genotype


def race_one(name: str, overrides: list[str], k: str, seed: int, args) -> dict:
    """One race and its fresh-seed check (module docstring); the row of :data:`RACES`."""
    from autoln.race import rule as R
    from autoln.race import schedule as S
    from autoln.race import verdict as V
    from autoln.data import load_corpus
    from autoln.race.run_race import job_config, race_pool, rule_of

    cfg = setting_config(name, [*overrides, *CANDIDATES[k], f"search.seed={seed}"], args.config)
    folder = Path(args.out) / name / f"race{k}" / f"search-seed{seed}"
    genotype = search(cfg, folder)
    corpus = load_corpus(cfg.data)
    entries, aliases, specs = race_pool(cfg, genotype, corpus.vocab_size, folder)
    space = "+".join(cfg.model.searched_candidates())
    retrains = TableRetrains(name, space, args.table, folder, corpus.fingerprint)
    by_name = {e.name: e for e in entries}
    rule, full = rule_of(cfg), cfg.retrain.steps

    def measure(job) -> float:
        run_dir = folder / "race" / job.entry / f"steps{job.steps}-seed{job.seed}"
        return retrains.value(job_config(cfg, job), job.entry, specs[job.entry], by_name[job.entry].placements, run_dir)

    plan, values = S.run(entries, full, rule, measure)
    v = V.verdict(plan.finalists, values, full, rule, "bits/byte")
    # the best named placement for the fresh check: of the two best named at the race's seed 0 at the full budget, the one
    # with the better mean at the fresh seeds (chosen on the fresh seeds themselves, which can only flatter the baseline)
    at0 = {e.name: R.score(values[(e.name, full, 0)]) for e in entries if e.named and (e.name, full, 0) in values}
    top = sorted(at0, key=at0.get)[:2] or [v.named.name]
    fresh = {who: [measure(R.Job(who, full, i)) for i in args.fresh_seeds] for who in dict.fromkeys([v.answer.name, *top])}
    best = min(top, key=lambda who: statistics.mean(R.score(x) for x in fresh[who]))
    race_s = sum(retrains.wall.get((by_name[e].placements, cfg.retrain.seed + i, s), 0.0) for (e, s, i) in values)
    return {"setting": name, "space": space, "search_seed": seed, "rule": R.REVISION, "read_off": genotype.describe(), "answer": v.answer.name,
            "answer_placements": v.answer.placements, "outcome": v.outcome,
            "p_value": "" if v.p_value is None else f"{v.p_value:.4g}", "verdict": v.line,
            "search_s": f"{genotype.provenance['metrics']['wall_time_s']:.1f}", "race_retrains": len(values),
            "race_s": f"{race_s:.1f}", "fresh_seeds": " ".join(str(cfg.retrain.seed + i) for i in args.fresh_seeds),
            "fresh_answer": " / ".join(f"{x:.4f}" for x in fresh[v.answer.name]), "best_named": best,
            "fresh_best_named": " / ".join(f"{x:.4f}" for x in fresh[best]), "commit": retrains.commit}


def done_races(path: Path) -> set:
    """``(setting, space, search seed)`` of the races already in ``path``."""
    if not path.exists():
        return set()
    with open(path, newline="", encoding="utf-8") as f:
        return {(r["setting"], r["space"], int(r["search_seed"]), r["rule"]) for r in csv.DictReader(f)}


def append_race(path: Path, row: dict) -> None:
    """Append one race's row to ``path`` (header first if new), synced to disk."""
    append_csv_row(path, FIELDS, row)


def main(argv=None) -> int:
    p = OneLineParser(prog="race.py", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, "shallow,highlr")
    p.add_argument("--candidates", default="3,7", help="candidate sets: 3 and/or 7")
    p.add_argument("--search-seeds", default="0")
    p.add_argument("--fresh-seeds", default=",".join(str(i) for i in range(RaceRule().max_seeds, RaceRule().max_seeds + 3)),
                   help="seed indices (added to retrain.seed) of the fresh check (default 6,7,8: past every seed the final can use)")
    p.add_argument("--races", type=Path, default=RACES)
    args = p.parse_args(argv)
    args.fresh_seeds = [int(s) for s in args.fresh_seeds.split(",")]

    def body() -> None:
        from autoln.config import load_config

        names = parse_settings(args.settings)
        overrides = base_overrides(args)
        for name in names:
            for k in args.candidates.split(","):
                if k not in CANDIDATES:
                    p.error(f"--candidates: expected 3 or 7, got {k!r}")
                space = "+".join(load_config(args.config, [*overrides, *CANDIDATES[k]]).model.searched_candidates())
                for seed in (int(s) for s in args.search_seeds.split(",")):
                    if (name, space, seed, REVISION) in done_races(args.races):
                        continue
                    row = race_one(name, overrides, k, seed, args)
                    append_race(args.races, row)
                    print(f"[race] {name} {k} candidates, search seed {seed}: {row['verdict']}\n  fresh seeds {row['fresh_seeds']}: "
                          f"answer {row['fresh_answer']}, {row['best_named']} {row['fresh_best_named']}", flush=True)

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
