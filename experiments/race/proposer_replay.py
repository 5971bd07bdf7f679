"""Proposers against random search through the same race (issue 58; the rule, fixed before any
result: docs/results.md, *A search that beats random search*).

For each proposer (``race.proposer``: :mod:`autoln.race.propose`) and search seed, the race with
proposal rounds is run for real on the search's answer: the shortlist's rungs, then rounds of
``--proposals`` genotypes while the searched entries' retrain steps stay within ``--budget``
full-budget retrains, the named rung and the sequential final (rule r3). Every retrain is a row
of the setting's table and is reused from it, so a race is never paid for twice. Random search
through the same race at the same retrain steps is simulated from the table (``--runs``
runs): the same rule with ``proposer: random``, its genotypes drawn, in an order seeded by the
run, from the table's uniform sample (``own_model_truth.py``'s 40), the rows a run lacks
retrained and recorded (``--fill``: the first N runs; the others are left out and counted).

Worth of an answer: its mean validation loss at the full budget over seeds 0, 1, 2 (lower is
better). Reported per proposer: the share of (search seed, random run) pairs whose random answer
it beats (a tie counts half), by search seed and pooled; each answer's percentile among the
table's sampled genotypes (seed 0); its value at the fresh seeds 6, 7, 8 against today's answer
(``own_model_race.csv``, rule r3, the same search seed) and against the table's best genotype.
One row per proposer race goes to ``experiments/proposer_races.csv``::

    OMP_NUM_THREADS=1 python experiments/race/proposer_replay.py own-model --data input.txt \\
        --proposers local,ridge,tpe,gp,prior --search-seeds 0,1,2,3,4 [--runs 500] [--fill 500] [--report]

Settings: ``own-model``, nanoGPT-7 (``own_model_race.py``'s: 500 steps, the API's race, rows of
``own_model_truth.csv``); ``shallow``, ``shallow``-7 (``race.py``'s: 1000 steps, ``search.py``'s
race in this process on the searches of ``race.py``'s ``--out``, rows of ``retrains.csv``)::

    OMP_NUM_THREADS=1 python experiments/race/proposer_replay.py shallow --data WIKITEXT_FOLDER --search-seeds 0,1,2
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))  # for experiments.*

from autoln.core.io import append_csv_row  # noqa: E402
from autoln.race.propose import Proposer, Space  # noqa: E402
from autoln.race.rule import REVISION, RaceRule  # noqa: E402

OUT = ROOT / "experiments" / "proposer_races.csv"
FIELDS = ["setting", "proposer", "search_seed", "rule", "budget", "proposals", "answer", "answer_genotype", "origin", "outcome",
          "p_value", "verdict", "retrains", "retrain_steps", "worth", "fresh_answer", "commit"]
FRESH = (6, 7, 8)
WORTH_SEEDS = (0, 1, 2)


class SampleProposer(Proposer):
    """Random search from a fixed sample: the sample's genotypes in ``order`` (a permutation),
    the first ``n`` not taken each round. Deterministic, so a simulated run replays exactly."""

    name = "random"

    def __init__(self, space: Space, order: list[str]) -> None:
        super().__init__(space, 0)
        self.order = order

    def propose(self, r, n, seen, taken, rng):
        return [g for g in self.order if g not in taken][:n]

    def __call__(self, r, n, seen, taken):  # no random fill: the sample bounds the draw
        return [g for g in self.order if g not in taken][:n]


def read_rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def share(mine: float, others: list[float]) -> float:
    """The share of ``others`` that ``mine`` beats (lower is better, a tie half)."""
    return statistics.mean(1.0 if mine < o else 0.5 if mine == o else 0.0 for o in others)


class OwnModel:
    """nanoGPT-7 (``own_model_race.py``'s set-up)."""

    name = "nanoGPT-7"
    full = 500

    def __init__(self, args) -> None:
        from nanogpt_recipe import load_data

        from experiments.race.own_model_race import SETS, Trainer
        from experiments.truth.own_model_truth import CANDIDATES, N_SITES, sample_genotypes

        train_data, val_data, vocab = load_data(args.data)
        self.data, self.vocab = (train_data, val_data), vocab
        self.cands = SETS["7"]
        self.tr = Trainer(self.cands, self.data, vocab)
        self.sample = [" ".join(s) for s in sample_genotypes(40, N_SITES, CANDIDATES, 0)]
        self.space = Space(self.cands, N_SITES)

    def genotype(self, placements: str):
        from experiments.truth.own_model_truth import site_genotype

        return site_genotype(placements.split(), self.cands)

    def value(self, placements: str, seed: int, steps: int, name: str, fill: bool = True) -> float:
        """A retrain's value from the table (run and recorded when ``fill``, else KeyError)."""
        from experiments.race.own_model_race import rung_recipe

        key = (placements, seed, steps, rung_recipe(steps)[1])
        if key not in self.tr.done and not fill:
            raise KeyError(key)
        return self.tr.value(self.genotype(placements), seed, steps, name)

    def race(self, proposer: str, seed: int, rule: RaceRule):
        """The proposer's race on search seed ``seed``'s answer: the API's race, retrains from the table."""
        import autoln
        from experiments.race.own_model_race import placements_of, search_answer
        from nanogpt_recipe import Recipe

        searched = search_answer(self.cands, seed, self.data, self.vocab, Recipe())

        def train_fn(model, s, steps):
            model.autoln_value = self.value(" ".join(placements_of(model).values()), s, steps, f"propose:{proposer}")

        return autoln.race_genotypes(self.tr.build, searched, train=train_fn, evaluate=lambda m: getattr(m, "autoln_value", 0.0),
                                     steps=self.full, own="pre", seed=0, rule=rule, progress=False, unit="nats/char")

    def named(self) -> dict[str, str]:
        from experiments.truth.own_model_truth import named_genotypes

        return {k: " ".join(v) for k, v in named_genotypes(self.cands).items()}

    def today(self, seed: int) -> dict | None:
        """Today's race (``own_model_race.csv``, rule r3, seven candidates) at ``seed``."""
        from experiments.race.own_model_race import RACES

        return next((r for r in read_rows(RACES) if (r["candidates"], int(r["search_seed"]), r["rule"]) == ("7", seed, REVISION)), None)


class Shallow:
    """``shallow``-7 (``race.py``'s set-up: autoln's model, WikiText-2 bytes, 1000 steps,
    ``search.py``'s race run in this process on the table's retrains)."""

    name = "shallow-7"

    def __init__(self, args) -> None:
        from autoln.data import load_corpus
        from experiments.common.retrain_table import random_sample, read_table
        from experiments.common.validate import setting_config
        from experiments.race.race import TableRetrains

        self.args = args
        over = ["logging.progress=false", f"data.corpus={args.data}", "model.candidates=[pre, post, deepnorm, peri, outnorm, lns, none]"]
        self.cfg = setting_config("shallow", over, None)
        self.full = self.cfg.retrain.steps
        self.cands = tuple(self.cfg.model.searched_candidates())
        corpus = load_corpus(self.cfg.data)
        self.vocab, space = corpus.vocab_size, "+".join(self.cands)
        self.folder = Path(args.out) / "shallow" / "proposers"
        self.retrains = TableRetrains("shallow", space, args.table, self.folder, corpus.fingerprint)
        have = {r.genotype for r in read_table(args.table)
                if (r.setting, r.space, r.seed, r.steps) == ("shallow", space, self.cfg.retrain.seed, self.full)}
        self.sample = random_sample(have, list(self.cands), self.cfg.model.n_layers, 0)
        self.space = Space(self.cands, self.cfg.model.n_layers)

    def named(self) -> dict[str, str]:
        from autoln.models.genotype import baseline
        from autoln.race.run_race import named_specs

        return {n: baseline(n, self.cfg.model, self.vocab).describe() for n in named_specs(list(self.cands))}

    def value(self, placements: str, seed: int, steps: int, name: str, fill: bool = True) -> float:
        """A retrain's value (seed index ``seed``) from the table (run and recorded when ``fill``, else KeyError)."""
        from autoln.race.rule import Job
        from autoln.race.run_race import job_config
        from experiments.race.race_replay import write_genotype

        cfg = job_config(self.cfg, Job(placements, steps, seed))
        if self.retrains.find(cfg, placements) is None and not fill:
            raise KeyError((placements, seed, steps))
        named = {g: n for n, g in self.named().items()}
        spec = named.get(placements) or str(write_genotype(self.cfg, self.vocab, placements, self.folder))
        run_dir = self.folder / placements.replace(" ", "_") / f"steps{steps}-seed{seed}"
        return self.retrains.value(cfg, name, spec, placements, run_dir)

    def race(self, proposer: str, seed: int, rule: RaceRule):
        """The proposer's race on search seed ``seed``'s answer (``race.py``'s search folder), in
        process; returns an object with ``verdict``, ``values`` and ``record["verdict"]["origin"]``."""
        import dataclasses
        from types import SimpleNamespace

        from autoln.race.propose import make_proposer
        from autoln.race.rule import origin
        from autoln.race.run_race import RaceSetup, race_pool
        from autoln.race.verdict import verdict
        from experiments.race.race import search

        cfg = dataclasses.replace(self.cfg, search=dataclasses.replace(self.cfg.search, seed=seed),
                                  race=dataclasses.replace(self.cfg.race, proposer=proposer, budget=rule.budget, proposals=rule.proposals))
        folder = Path(self.args.out) / "shallow" / "race7" / f"search-seed{seed}"
        genotype = search(cfg, folder)
        entries, aliases, specs = race_pool(cfg, genotype, self.vocab, folder)
        probs = genotype.site_probabilities()
        setup = RaceSetup(cfg, folder, entries, aliases, specs, self.full, rule, "bits_per_byte", "replay", genotype,
                          make_proposer(proposer, Space(self.cands, probs.shape[0], probs), cfg.retrain.seed))
        values: dict = {}
        while True:
            p = setup.plan(values)
            if p.done:
                break
            for job in p.pending:
                placements = next(e.placements for e in entries + p.proposed if e.name == job.entry)
                values[job.key] = self.value(placements, job.seed, job.steps, f"propose:{proposer}")
        v = verdict(p.finalists, values, self.full, rule, "bits/byte")
        return SimpleNamespace(verdict=v, values=values, record={"verdict": {"origin": origin(v.answer)}})

    def today(self, seed: int) -> dict | None:
        """Today's answer at ``seed``: ``final_replays.csv``'s rule-r3 final where it holds one,
        else ``races.csv``'s (a final the searched finalist lost at seed 0 ends so under r3 too)."""
        replays = ROOT / "experiments" / "final_replays.csv"
        r = next((r for r in read_rows(replays) if r["final"] == f"shallow7-seed{seed}"), None)
        if r:
            answer = r["searched"] if r["outcome"] == "searched-wins" else self.named()[r["named"]]
            return {"answer_genotype": answer, "fresh_answer": r["fresh_searched"] if r["outcome"] == "searched-wins" else r["fresh_named"]}
        races = ROOT / "experiments" / "races.csv"
        r = next((r for r in read_rows(races) if (r["setting"], r["space"], int(r["search_seed"])) ==
                  ("shallow", "+".join(self.cands), seed) and r["outcome"] == "named-wins"), None)
        if r is None:
            return None
        answer = r["answer_placements"]  # at the fresh seeds the proposers' answers are read at (races.csv's are 3-5)
        return {"answer_genotype": answer, "fresh_answer": " / ".join(f"{self.value(answer, i, self.full, 'fresh'):.4f}" for i in FRESH)}


SETTINGS = {"own-model": OwnModel, "shallow": Shallow}


def worth(s, placements: str, fill: bool = True) -> float:
    return statistics.mean(s.value(placements, i, s.full, "worth", fill) for i in WORTH_SEEDS)


def proposer_race(s, proposer: str, seed: int, args) -> dict:
    """One proposer race (module docstring): its row, taken from ``OUT`` when there."""
    tag = f"{REVISION}:{proposer}"
    have = next((r for r in read_rows(OUT) if (r["setting"], r["proposer"], int(r["search_seed"]), r["rule"], float(r["budget"]),
                                                int(r["proposals"])) == (s.name, proposer, seed, tag, args.budget, args.proposals)), None)
    if have:
        return have
    from experiments.truth.own_model_truth import current_commit

    rule = RaceRule(proposer=proposer, budget=args.budget, proposals=args.proposals)
    t0 = time.perf_counter()
    out = s.race(proposer, seed, rule)
    answer = out.verdict.answer.placements
    row = {"setting": s.name, "proposer": proposer, "search_seed": seed, "rule": tag, "budget": args.budget,
           "proposals": args.proposals, "answer": out.verdict.answer.name, "answer_genotype": answer,
           "origin": out.record["verdict"]["origin"], "outcome": out.verdict.outcome,
           "p_value": "" if out.verdict.p_value is None else f"{out.verdict.p_value:.4g}", "verdict": out.verdict.line,
           "retrains": len(out.values), "retrain_steps": sum(k[1] for k in out.values), "worth": f"{worth(s, answer):.6f}",
           "fresh_answer": " / ".join(f"{s.value(answer, i, s.full, 'fresh'):.4f}" for i in FRESH), "commit": current_commit()}
    append_csv_row(OUT, FIELDS, row)
    print(f"[propose] {s.name} {proposer} seed {seed}: {row['verdict']} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return row


def random_runs(s, args) -> tuple[list[float], int, list[int]]:
    """``--runs`` simulated random-search races (module docstring): their answers' worths, the
    runs left out, and each run's retrain steps."""
    from autoln.race.rule import make_pool
    from autoln.race.schedule import plan
    from autoln.race.verdict import verdict

    rule = RaceRule(proposer="random", budget=args.budget, proposals=args.proposals)
    entries, _ = make_pool([], list(s.named().items()))
    worths, left, steps = [], 0, []
    for r in range(args.runs):
        order = [s.sample[i] for i in np.random.default_rng([args.seed, r]).permutation(len(s.sample))]
        proposer, fill = SampleProposer(s.space, order), r < args.fill
        mapping, values = {e.name: e.placements for e in entries}, {}
        try:
            while True:
                p = plan(entries, values, s.full, rule, proposer)
                mapping.update({e.name: e.placements for e in p.proposed})
                if p.done:
                    break
                for job in p.pending:
                    values[job.key] = s.value(mapping[job.entry], job.seed, job.steps, "random-race", fill)
            worths.append(worth(s, verdict(p.finalists, values, s.full, rule).answer.placements, fill))
            steps.append(sum(k[1] for k in values))
        except KeyError:
            left += 1
    return worths, left, steps


def share_row(s, r: dict, worths: list[float]) -> dict:
    """A proposer race's row of ``proposer_shares.csv`` (``proposer_rule.FIELDS``), every value at
    the table's full precision (``proposer_races.csv`` rounds): its share against ``worths``, its
    answer's worth and values at the fresh seeds, and the fixed shortlist's answer's at the same
    search seed (``today``; empty where there is none)."""
    seed, answer = int(r["search_seed"]), r["answer_genotype"]
    fixed = (s.today(seed) or {}).get("answer_genotype", "")
    w = worth(s, answer)

    def fresh(g: str) -> str:
        return " ".join(repr(s.value(g, i, s.full, "fresh")) for i in FRESH) if g else ""

    return {"setting": s.name, "proposer": r["proposer"], "search_seed": seed, "answer_genotype": answer,
            "share": repr(share(w, worths)) if worths else "", "runs": len(worths), "worth": repr(w), "fresh": fresh(answer),
            "fixed_genotype": fixed, "fixed_fresh": fresh(fixed)}


def save_shares(path: Path, new: list[dict]) -> None:
    """Merge ``new`` share rows into ``path`` (one per setting, proposer, search seed), atomically."""
    import io

    from autoln.core.io import write_text_atomic
    from experiments.race.proposer_rule import FIELDS as SHARE_FIELDS

    def key(r: dict) -> tuple:
        return r["setting"], r["proposer"], int(r["search_seed"])

    rows = {key(r): r for r in read_rows(path)} | {key(r): r for r in new}
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=SHARE_FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(sorted(rows.values(), key=key))
    write_text_atomic(path, out.getvalue())


def report(s, rows: list[dict], worths: list[float], left: int, steps: list[int]) -> tuple[str, list[dict]]:
    """The figures of the proposers' races ``rows`` against the random runs' ``worths``: the
    printed lines and the share rows (:func:`share_row`)."""
    sample0 = [s.value(g, 0, s.full, "sample", False) for g in s.sample]
    best = min(sample0)
    shares = [share_row(s, r, worths) for r in rows]
    lines = [f"{s.name}: random search through the same race, {len(worths)} simulated runs ({left} left out for rows the table "
             f"lacks), retrain steps median {statistics.median(steps) if steps else 0:.0f}; its answers' worth mean "
             f"{statistics.mean(worths) if worths else float('nan'):.4f}"]
    by: dict[str, list[float]] = {}
    for r, sr in zip(rows, shares):
        w = float(sr["worth"])
        sh = float(sr["share"]) if worths else float("nan")
        by.setdefault(r["proposer"], []).append(sh)
        pct = 100 * sum(x < float(s.value(r["answer_genotype"], 0, s.full, "sample", True)) for x in sample0) / len(sample0)
        today = s.today(int(r["search_seed"]))
        t = f"; today's answer {today['answer_genotype']} fresh {today['fresh_answer']}" if today else ""
        lines.append(f"  {r['proposer']:6s} seed {r['search_seed']}: {r['answer']} = {r['answer_genotype']} ({r['origin']}), worth "
                     f"{w:.4f}, beats random in {100 * sh:.1f} %, {pct:.0f} % of the sample better at seed 0 (sample best "
                     f"{best:.4f}); fresh {r['fresh_answer']}{t}; {r['retrain_steps']} steps")
    for p, v in by.items():
        lines.append(f"  {p}: beats random search in {100 * statistics.mean(v):.1f} % of (search seed, run) pairs "
                     f"(by seed: {', '.join(f'{100 * x:.0f}' for x in v)})")
    return "\n".join(lines), shares


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("setting", choices=list(SETTINGS))
    p.add_argument("--data", required=True, help="own-model: tiny Shakespeare's input.txt; shallow: the WikiText-2 folder")
    p.add_argument("--out", default="runs/validate", help="shallow: the searches' and retrains' folders (race.py's)")
    p.add_argument("--table", type=Path, default=None, help="shallow: the retrain table (default experiments/retrains.csv)")
    p.add_argument("--proposers", default="local,ridge,tpe,gp,prior")
    p.add_argument("--search-seeds", default="0,1,2,3,4")
    p.add_argument("--budget", type=float, default=RaceRule().budget, help="the searched entries' retrain steps, in full retrains")
    p.add_argument("--proposals", type=int, default=RaceRule().proposals)
    p.add_argument("--runs", type=int, default=500, help="simulated random-search runs")
    p.add_argument("--fill", type=int, default=500, help="runs allowed to retrain rows the table lacks")
    p.add_argument("--seed", type=int, default=0, help="the simulated runs' seed")
    p.add_argument("--report", action="store_true", help="train nothing for the proposers' races: report the rows there")
    args = p.parse_args(argv)
    if args.table is None:
        from experiments.common.retrain_table import default_table

        args.table = default_table()
    s = SETTINGS[args.setting](args)
    rows = []
    for proposer in args.proposers.split(","):
        for seed in (int(x) for x in args.search_seeds.split(",")):
            if args.report:
                rows += [r for r in read_rows(OUT) if (r["setting"], r["proposer"], int(r["search_seed"])) == (s.name, proposer, seed)]
            else:
                rows.append(proposer_race(s, proposer, seed, args))
    worths, left, steps = random_runs(s, args)
    text, shares = report(s, rows, worths, left, steps)
    print(text, flush=True)
    if worths and not left:  # the rule's figures only from a complete yardstick
        from experiments.race.proposer_rule import SHARES

        save_shares(SHARES, shares)
        print(f"[propose] {len(shares)} rows -> {SHARES.name}; `python experiments/race/proposer_rule.py` applies the rule", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
