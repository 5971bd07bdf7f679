"""The race's final, measured: its false-win rate under the null and its power at leads of 1, 2
and 3 paired standard deviations, for revision r2's 3-seed paired t-test and the group-sequential
final (:mod:`autoln.race.sequential`), by simulation.

The noise is the tables' own: every pair of genotypes measured at the same 3 or more seeds at
one length in ``experiments/own_model_truth.csv`` (nanoGPT's model) or in
``experiments/retrains.csv`` (autoln's settings) gives paired differences ``d_i`` (same seed:
same initial weights and batches); their residuals ``(d_i - mean d) * sqrt(n / (n - 1))``, with
both signs (under the null either finalist may be the searched one), are pooled per table and
scaled to unit variance (the pooled paired standard deviation), and each
simulated final draws its differences from that pool with replacement (``--noise normal``: a
standard normal instead). A lead of ``k`` paired standard deviations shifts every difference
by ``-k``. Each cell is ``--runs`` finals (10,000 by default), with its Monte Carlo standard
error, and the mean seeds a finalist runs::

    python experiments/race/final_power.py [--runs 10000] [--leads 0,1,2,3] [--designs r2,obrien-fleming,pocock]
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root

from autoln.race.sequential import Design, simulate  # noqa: E402

EXPERIMENTS = Path(__file__).resolve().parents[1]
TABLES = {"nanoGPT": (EXPERIMENTS / "own_model_truth.csv", "val", ("space", "setup")),
          "autoln": (EXPERIMENTS / "retrains.csv", "valid", ("setting", "space", "config"))}


def residuals(path: Path, value: str, group: tuple[str, ...]) -> tuple[list[float], int]:
    """The pooled residuals of the paired differences of ``path`` (module docstring), scaled to
    unit variance, and the number of pairs behind them."""
    per = defaultdict(dict)
    with open(path, newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            per[(tuple(r[g] for g in group), r["steps"], r["genotype"])][int(r["seed"])] = float(r[value])
    by_setting = defaultdict(list)
    for (setting, steps, genotype), seeds in per.items():
        if len(seeds) >= 3:
            by_setting[(setting, steps)].append(seeds)
    pool, pairs = [], 0
    for runs in by_setting.values():
        for a, b in combinations(runs, 2):
            common = sorted(set(a) & set(b))
            if len(common) < 3:
                continue
            d = [a[s] - b[s] for s in common]
            m, n = statistics.mean(d), len(d)
            r = [(x - m) * math.sqrt(n / (n - 1)) for x in d]
            pool += r + [-x for x in r]  # under the null which finalist is the searched one is a coin: both signs
            pairs += 1
    sd = math.sqrt(sum(x * x for x in pool) / len(pool))
    return [x / sd for x in pool], pairs


DESIGNS = {"r2": Design(3, 3, 0.05), "obrien-fleming": Design(3, 6, 0.05, "obrien-fleming"),
           "pocock": Design(3, 6, 0.05, "pocock")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10_000)
    p.add_argument("--leads", default="0,1,2,3", help="leads in paired standard deviations")
    p.add_argument("--designs", default="r2,obrien-fleming,pocock", help=f"a comma-separated subset of {list(DESIGNS)}")
    p.add_argument("--noise", default="tables", choices=("tables", "normal"))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    leads = [float(x) for x in args.leads.split(",")]
    designs = args.designs.split(",")
    unknown = [d for d in designs if d not in DESIGNS]
    if unknown:
        p.error(f"--designs: unknown {unknown}; expected a subset of {list(DESIGNS)}")
    noises = {"normal": None} if args.noise == "normal" else {}
    if args.noise == "tables":
        for name, (path, value, group) in TABLES.items():
            pool, pairs = residuals(path, value, group)
            noises[name] = pool
            print(f"noise of {name}: {len(pool)} residuals of {pairs} pairs ({path.name})", file=sys.stderr)
    print("| noise | final | " + " | ".join(f"lead {x:g} sd: wins (seeds)" for x in leads) + " |")
    print("|---|---|" + "---|" * len(leads))
    for name, pool in noises.items():
        for d in designs:
            cells = []
            for lead in leads:
                r = simulate(DESIGNS[d], lead, args.runs, seed=args.seed, noise=pool)
                cells.append(f"{r['win']:.4f} ± {r['win_se']:.4f} ({r['seeds']:.2f})")
            print(f"| {name} | {d} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
