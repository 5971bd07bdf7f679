"""Ground truth at longer training: the tables' best genotypes and the named placements retrained
at a multiple (``--multiplier``, 4 by default) of the setting's retrain budget, kept as rows of
the same tables, so a ranking at 1x can be checked at 4x.

Two settings, each a subcommand:

- ``own-model``: nanoGPT's model over seven candidates (``own_model_truth.py``'s set-up, 500
  steps at 1x). Every named placement and the ``--top`` (10) best genotypes of
  ``own_model_truth.csv`` (ranked by their mean validation loss over the seeds the table held
  at 1x when this began: :data:`OWN_MODEL_TOP`) at ``multiplier x 500`` steps, ``--seeds`` (3) seeds each. nanoGPT's schedule is
  stretched to the longer end (warm-up 100 steps as at 1x, cosine to ``min_lr`` at the last
  step). Rows in ``own_model_truth.csv`` (nats per character).
- ``shallow``: autoln's ``shallow`` setting over seven candidates (``validate.py``'s, 1000 steps
  at 1x). The ``--top`` (5) best genotypes of ``retrains.csv`` at 1x (by seed 0, the seed every
  genotype of the table has, when this began: :data:`SHALLOW_TOP`), and ``mix-ln``, ``all-post``, ``all-pre``, at ``multiplier x
  1000`` steps (``eval_every`` scaled alike, as ``horizon.py`` does, so rows of ``horizon.py``
  are reused), ``--seeds`` (2) seeds each. Each finished retrain is recorded in
  ``retrains.csv`` at once (bits per byte), so a killed session loses at most the retrain it
  was in (whose run folder under ``--out`` resumes from its checkpoint).

Both are resumable: a retrain the table holds is never run again. ``--report`` prints, from the
table only, each genotype's mean at 1x and at the longer budget, Kendall's tau between the two
rankings (genotypes with every seed at both budgets; means over the seeds each budget holds), and
the noise ceiling at the longer budget (tau of seed 0 against seed 1 there)::

    OMP_NUM_THREADS=1 python experiments/truth/truth_longer.py own-model --data input.txt
    OMP_NUM_THREADS=1 python experiments/truth/truth_longer.py shallow --data WIKITEXT_FOLDER --out runs/truth_longer
    python experiments/truth/truth_longer.py shallow --data WIKITEXT_FOLDER --report
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

EXPERIMENTS = Path(__file__).resolve().parents[1]  # the tables' folder
sys.path.insert(0, str(EXPERIMENTS.parent))  # the repository root, for experiments.*

SEVEN = "model.candidates=[pre, post, deepnorm, peri, outnorm, lns, none]"
SHALLOW_NAMED = ("mix-ln", "all-post", "all-pre")

#: The ``own-model`` genotypes, fixed: the 10 best of ``own_model_truth.csv`` by their mean at
#: 500 steps when the ground truth at 4x began (the table's rows up to commit 0d96520). Later rows
#: (the proposers' races add better genotypes) do not move the set, so the run ends and the
#: ranking it checks is the one it set out to check.
OWN_MODEL_TOP = (
    "pre post outnorm none peri outnorm peri outnorm", "pre deepnorm outnorm pre peri outnorm lns none",
    "pre post outnorm none peri none none peri", "outnorm deepnorm peri lns outnorm peri pre peri",
    "pre none post peri peri none outnorm peri", "deepnorm pre pre pre pre outnorm peri outnorm",
    "pre post post peri peri lns none peri", "outnorm post pre lns post peri outnorm peri",
    "deepnorm post outnorm peri outnorm none none deepnorm", "outnorm deepnorm post peri none none pre peri",
)
#: The ``shallow`` genotypes, fixed alike: the 5 best of ``retrains.csv`` at 1000 steps, seed 0.
SHALLOW_TOP = ("deepnorm none none outnorm outnorm outnorm", "deepnorm pre none outnorm outnorm outnorm",
               "deepnorm none none peri peri outnorm", "deepnorm none outnorm peri peri peri", "deepnorm pre none outnorm outnorm none")


def tau_report(values: dict[str, dict[int, dict[int, float]]], short: int, long: int, names: dict[str, str]) -> str:
    """Each genotype's mean at ``short`` and ``long`` steps, Kendall's tau between the two
    rankings and the noise ceiling at ``long`` (seed 0 against seed 1).

    ``values[genotype][steps][seed]`` is a validation loss (lower is better); ``names`` labels
    genotypes. Genotypes with no row at ``long`` are left out."""
    from scipy.stats import kendalltau

    def mean(g: str, steps: int) -> float | None:
        v = values[g].get(steps, {})
        return statistics.mean(v.values()) if v else None

    gs = [g for g in values if values[g].get(long) and values[g].get(short)]
    gs.sort(key=lambda g: mean(g, long))
    lines = [f"{'genotype':52s} {short:>6d} steps   {long:>6d} steps (seeds)"]
    for g in gs:
        v = values[g][long]
        sd = f" ± {statistics.stdev(v.values()):.4f}" if len(v) > 1 else ""
        lines.append(f"{(names.get(g) or g)[:52]:52s} {mean(g, short):11.4f}   {mean(g, long):11.4f}{sd} ({len(v)})")
    if len(gs) >= 3:
        t = kendalltau([mean(g, short) for g in gs], [mean(g, long) for g in gs]).statistic
        lines.append(f"Kendall tau, {short}-step against {long}-step ranking: {t:.3f} over {len(gs)} genotypes")
    both = [g for g in gs if 0 in values[g][long] and 1 in values[g][long]]
    if len(both) >= 3:
        c = kendalltau([values[g][long][0] for g in both], [values[g][long][1] for g in both]).statistic
        lines.append(f"noise ceiling at {long} steps: Kendall tau(seed 0, seed 1) = {c:.3f} over {len(both)} genotypes")
    return "\n".join(lines)


def own_model(args) -> int:
    """The ``own-model`` subcommand (module docstring)."""
    from experiments.truth.own_model_truth import (CANDIDATES, SETUP, append_row, current_commit, load_data, named_genotypes,
                                                    read_table, retrain)
    from nanogpt_recipe import Recipe

    space = "+".join(CANDIDATES)
    short, long = 500, 500 * args.multiplier
    done = read_table(args.table, space)
    values: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    names: dict[str, str] = {}
    for (g, seed, steps), r in done.items():
        values[g][steps][seed] = float(r["val"])
        names.setdefault(g, r["name"])
    named = {" ".join(v): k for k, v in named_genotypes().items()}
    jobs = [*named, *OWN_MODEL_TOP[:args.top]]
    if not args.report:
        train_data, val_data, vocab = load_data(args.data)
        recipe, commit = Recipe(steps=long), current_commit()
        for seed in range(args.seeds):
            for g in jobs:
                if (g, seed, long) in done:
                    continue
                val, secs = retrain(g.split(), seed, (train_data, val_data), vocab, recipe)
                label = named.get(g) or names.get(g, "top")
                row = {"space": space, "name": label, "genotype": g, "seed": seed, "steps": long, "val": f"{val:.6f}",
                       "train_s": f"{secs:.1f}", "setup": SETUP, "commit": commit}
                append_row(args.table, row)
                done[(g, seed, long)] = row
                values[g][long][seed] = val
                print(f"[truth-longer] {label} seed {seed} {long} steps: {g}  val {val:.4f}  ({secs:.0f} s)",
                      file=sys.stderr, flush=True)
    labels = {g: f"{named[g]}" if g in named else g for g in jobs}
    print(tau_report({g: values[g] for g in jobs}, short, long, labels))
    return 0


def shallow(args) -> int:
    """The ``shallow`` subcommand (module docstring)."""
    import dataclasses

    import numpy as np

    from autoln.data import HEADLINE, load_corpus
    from autoln.models.genotype import from_probabilities, named_blocks
    from experiments.common.retrain_table import compare_with_table, read_table, space_of
    from experiments.common.validate import setting_config

    overrides = [SEVEN, "logging.progress=false", f"data.corpus={args.data}"]
    cfg = setting_config("shallow", overrides, None)
    short = cfg.retrain.steps
    long = short * args.multiplier
    longer = dataclasses.replace(cfg, retrain=dataclasses.replace(cfg.retrain, steps=long,
                                                                  eval_every=cfg.retrain.eval_every * args.multiplier))
    space = space_of(cfg)
    cands = cfg.model.searched_candidates()

    def table_values():
        values: dict[str, dict[int, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
        for r in read_table(args.table) if args.table.exists() else []:
            if r.setting == "shallow" and r.space == space:
                values[r.genotype][r.steps][r.seed] = r.valid
        return values

    values = table_values()
    named = {" ".join(named_blocks(n, cfg.model.n_layers)): n for n in SHALLOW_NAMED}
    top = list(SHALLOW_TOP[:args.top])
    if not args.report:
        vocab = load_corpus(cfg.data).vocab_size
        files = args.out / "genotypes"
        files.mkdir(parents=True, exist_ok=True)
        specs = []
        for i, g in enumerate(top):
            path = files / f"top{i}.json"
            if not path.exists():
                idx = [cands.index(p) for p in g.split()]
                from_probabilities(np.eye(len(cands))[idx], cfg.model, vocab, {"truth_longer": {"rank": i}}, idx).save(path)
            specs.append((g, str(path)))
        specs += [(g, n) for g, n in named.items()]
        for seed in range(args.seeds):  # a seed of every genotype first: the ranking fills in evenly
            for g, spec in specs:
                if seed in values[g].get(long, {}):
                    continue
                folder = args.out / f"{long}" / g.replace(" ", "-")
                files_, base = ([], [spec]) if spec in SHALLOW_NAMED else ([spec], [])
                compare_with_table(longer, "shallow", files_, base, seed + 1, folder, args.table)
                values = table_values()
                print(f"[truth-longer] shallow {g} seed {seed} {long} steps: valid "
                      f"{values[g][long].get(seed, float('nan')):.4f} {HEADLINE[cfg.data.tokenizer]}", file=sys.stderr, flush=True)
    jobs = [*top, *named]
    print(tau_report({g: values[g] for g in jobs}, short, long, {g: named.get(g, g) for g in jobs}))
    return 0


def main(argv=None) -> int:
    from experiments.common.retrain_table import default_table

    p = argparse.ArgumentParser(prog="truth_longer.py", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="setting", required=True)
    a = sub.add_parser("own-model", help="nanoGPT's model over seven candidates (own_model_truth.csv)")
    a.add_argument("--data", required=True, help="tiny Shakespeare's input.txt or a nanoGPT data folder")
    a.add_argument("--table", type=Path, default=EXPERIMENTS / "own_model_truth.csv")
    a.add_argument("--top", type=int, default=10)
    a.add_argument("--seeds", type=int, default=3)
    b = sub.add_parser("shallow", help="autoln's shallow setting over seven candidates (retrains.csv)")
    b.add_argument("--data", required=True, help="the WikiText-2 folder")
    b.add_argument("--table", type=Path, default=default_table())
    b.add_argument("--out", type=Path, default=Path("runs/truth_longer"))
    b.add_argument("--top", type=int, default=5)
    b.add_argument("--seeds", type=int, default=2)
    for q in (a, b):
        q.add_argument("--multiplier", type=int, default=4)
        q.add_argument("--report", action="store_true", help="print the table's numbers only, train nothing")
    args = p.parse_args(argv)
    return own_model(args) if args.setting == "own-model" else shallow(args)


if __name__ == "__main__":
    sys.exit(main())
