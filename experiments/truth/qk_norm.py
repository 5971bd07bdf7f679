"""QK-norm in nanoGPT's own model: every named placement with and without QK-norm, at nanoGPT's
learning rate and at 3x and 10x it, and one race per learning rate with QK-norm searched.

Setting: ``own_model_truth.py``'s (``examples/gpt.py``: nanoGPT's ``model.py`` with the README's
diff, ``bias=False``; tiny Shakespeare as characters; nanoGPT's loop and recipe; 4 layers of width
64, block 64, batch 32, 500 steps), the seven candidates. Peak learning rates :data:`LRS` (nanoGPT's
``shakespeare_char`` 1e-3, then 3e-3 and 1e-2), ``min_lr`` a tenth of each; the warm-up stays 100
steps. High learning rates are where QK-norm is expected to matter (Wortsman et al. 2023, §3.1:
it removes the attention-logit growth that makes them diverge).

1. **The grid**: the named placements (``all-<c>`` for the seven, ``mix-ln``, ``pre-post``), each
   with QK-norm ``none`` and ``qk`` (per head), and ``olmo2`` (``all-outnorm`` with QK-norm across
   heads, ``qk-all``), at seeds 0, 1, 2 and every learning rate. ``all-peri`` + ``qk`` is Gemma 3's
   pairing, ``all-pre`` + ``qk`` Qwen 3's.
2. **The races** (``--races``): per learning rate, ``autoln.search`` over the seven placements and
   QK-norm ``none, qk, qk-all`` (search seed 0, answers kept as
   ``experiments/own_model/qk_lr<lr>_seed<s>.json``), then ``autoln.race_genotypes`` with nanoGPT's
   loop at that learning rate; one row per race in ``experiments/qk_races.csv``.
3. **The fresh seeds** (``--fresh``): each race whose answer is searched, the answer against the
   named finalist it beat at seeds 6, 7, 8 (past every seed its final can use), printed; with
   ``--lasts K`` also at K times the budget (does the lead last?).

Every retrain is a row of ``experiments/own_model_truth.csv`` (column ``qk``; the genotype's text
ends in `` | <QK choice per attention>`` with QK-norm somewhere; ``setup`` ends in ``lr=<lr>`` away
from 1e-3), reused, never re-run: at 1e-3 without QK-norm the rows are the ground truth's own.
A retrain that diverges (a non-finite validation loss) is a row with ``nan``, reported as such::

    OMP_NUM_THREADS=1 python experiments/truth/qk_norm.py --data input.txt [--races] [--fresh] [--lasts 4] [--report]
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))
from nanogpt_recipe import Recipe, load_data  # noqa: E402

import autoln  # noqa: E402
from autoln.api.racing import named_site_genotypes  # noqa: E402
from autoln.core.io import append_csv_row  # noqa: E402
from autoln.race.rule import REVISION  # noqa: E402
from autoln.api.sites import model_qk_norms  # noqa: E402
from experiments.race.own_model_race import FRESH, SETS, Trainer, as_genotype, rung_recipe, search_answer  # noqa: E402
from experiments.truth.own_model_truth import TABLE, ensure_qk_column, site_genotype  # noqa: E402

LRS = (1e-3, 3e-3, 1e-2)
SEEDS = (0, 1, 2)
CANDS = SETS["7"]
QK = ("none", "qk", "qk-all")
RACES = ROOT / "experiments" / "qk_races.csv"
RACE_FIELDS = ["lr", "search_seed", "rule", "read_off", "answer", "answer_genotype", "outcome", "p_value", "verdict",
               "search_s", "race_s", "retrains", "commit"]


def grid_genotypes(trainer: Trainer) -> dict[str, autoln.SiteGenotype]:
    """The grid's genotypes by name: each named placement without QK-norm and ``+qk``, and ``olmo2``."""
    named = named_site_genotypes(trainer.build())
    out = {}
    for name, g in named.items():
        if name in ("olmo2", "gemma3", "qwen3"):
            continue
        qk_names = list(g.qk)
        for choice in ("none", "qk"):
            out[name if choice == "none" else f"{name}+qk"] = autoln.SiteGenotype(
                g.candidates, dict(g.sites), dict(g.probabilities), {}, {n: choice for n in qk_names}, list(QK),
                {n: [1.0 if c == choice else 0.0 for c in QK] for n in qk_names})
    out["olmo2"] = named["olmo2"]
    return out


def run_grid(data, vocab: int) -> None:
    """Every genotype of :func:`grid_genotypes` at every learning rate and seed (table first)."""
    for lr in LRS:
        tr = Trainer(CANDS, data, vocab, QK, lr)
        for seed in SEEDS:
            for name, g in grid_genotypes(tr).items():
                tr.value(g, seed, Recipe().steps, f"qk-grid:{name}")


def race_lr(lr: float, seed: int, data, vocab: int) -> dict:
    """The search (seven placements, QK-norm searched) and race at learning rate ``lr``; the row of :data:`RACES`."""
    recipe, _ = rung_recipe(Recipe().steps, lr)
    tr = Trainer(CANDS, data, vocab, QK, lr)
    searched = search_answer(CANDS, seed, data, vocab, recipe, QK, lr, name=f"qk_lr{lr:g}_seed{seed}")

    def train_fn(model, s, steps):
        model.autoln_value = tr.value(as_genotype(model, CANDS, QK), s, steps, f"qk-race:lr={lr:g}")

    t0 = time.perf_counter()
    outcome = autoln.race_genotypes(tr.build, searched, train=train_fn, evaluate=lambda m: getattr(m, "autoln_value", 0.0),
                                    steps=recipe.steps, own="pre", seed=0, unit="nats/char")
    v = outcome.verdict
    return {"lr": f"{lr:g}", "search_seed": seed, "rule": REVISION, "read_off": searched.describe(), "answer": v.answer.name,
            "answer_genotype": outcome.genotype.describe(), "outcome": v.outcome,
            "p_value": "" if v.p_value is None else f"{v.p_value:.4g}", "verdict": v.line,
            "search_s": f"{searched.provenance.get('wall_time_s', 0):.1f}", "race_s": f"{time.perf_counter() - t0:.1f}",
            "retrains": len(outcome.values), "commit": tr.commit}


def with_qk(text: str, trainer: Trainer) -> autoln.SiteGenotype:
    """A race's ``answer_genotype`` text (``pre ... | qk none ...``: a placement per site, then a
    QK choice per attention) as the site genotype it trains."""
    sites, _, qk = text.partition(" | ")
    base = site_genotype(sites.split(), CANDS)
    names = [n for n, _ in model_qk_norms(trainer.build())]
    choices = qk.split() if qk else ["none"] * len(names)
    if len(choices) != len(names):
        raise ValueError(f"{text!r}: expected {len(names)} QK choices, got {len(choices)}")
    return autoln.SiteGenotype(base.candidates, base.sites, base.probabilities, {}, dict(zip(names, choices)), list(QK),
                               {n: [1.0 if c == x else 0.0 for c in QK] for n, x in zip(names, choices)})


def fresh(row: dict, data, vocab: int, multiplier: int = 1) -> str:
    """A race whose answer is searched, checked at the fresh seeds :data:`FRESH` (past every seed
    its final can use): the answer against the named finalist it beat, both retrained at
    ``multiplier`` times the budget (``truth_longer.py``'s longer recipe: warm-up 100 steps, the
    cosine stretched), rows of the table. For ``multiplier`` > 1 also the race's own verdict with
    ``race.horizons=[1, multiplier]`` on the final's seeds (rows at the budget, the final run
    again seed by seed) and seeds 0-2 at the longer budget, and whether its horizon line agrees
    with the fresh seeds (``experiments/common/lasts.py``). Returns those lines."""
    from autoln.race.verdict import lead_line
    from experiments.common.lasts import agreement, race_horizon

    lr, steps = float(row["lr"]), Recipe().steps * multiplier
    tr = Trainer(CANDS, data, vocab, QK, lr)
    named_name = re.search(r"\(beats (\S+) at", row["verdict"]).group(1)
    named = named_site_genotypes(tr.build())[named_name]
    answer = with_qk(row["answer_genotype"], tr)
    tag = "qk-fresh" if multiplier == 1 else f"qk-lasts{multiplier}"
    a = [tr.value(answer, s, steps, f"{tag}:lr={lr:g}:answer") for s in FRESH]
    b = [tr.value(named, s, steps, f"{tag}:lr={lr:g}:{named_name}") for s in FRESH]
    line = f"[{tag}] lr {lr:g}, search seed {row['search_seed']}, {steps} steps, fresh seeds {FRESH}: {lead_line(a, b, ('answer', named_name))}"
    if multiplier == 1:
        return line
    full = Recipe().steps

    def value(entry, i, n):  # the final's rows at the budget, the horizon's at ``steps``
        g, who = (answer, "answer") if entry == "searched" else (named, named_name)
        return tr.value(g, i, n, f"qk-race:lr={lr:g}" if n == full else f"{tag}:lr={lr:g}:{who}")

    said = race_horizon(value, answer.describe(), (named_name, named.describe()), full, multiplier, "nats/char")
    return f"{line}\n[{tag}] lr {lr:g}: the race's verdict with race.horizons=[1, {multiplier}]: {said.line}\n" \
           f"[{tag}] lr {lr:g}: {agreement(said, a, b)}"


def report(data_vocab) -> str:
    """The grid as a Markdown table: per genotype and learning rate the mean ± std over the seeds
    (nats/char), ``diverged`` where a seed's loss is not finite."""
    tr = Trainer(CANDS, None, data_vocab, QK)
    genotypes = grid_genotypes(tr)
    with open(TABLE, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    lines = ["| genotype | QK-norm | " + " | ".join(f"lr {lr:g}" for lr in LRS) + " |", "|---|---|" + "---|" * len(LRS)]
    for name, g in genotypes.items():
        cells = []
        for lr in LRS:
            _, setup = rung_recipe(Recipe().steps, lr)
            by_seed = {int(r["seed"]): float(r["val"]) for r in rows if r["setup"] == setup and r["genotype"] == g.describe()
                       and int(r["steps"]) == Recipe().steps and int(r["seed"]) in SEEDS}  # one row per seed (any space)
            vals = list(by_seed.values())
            bad = sum(not math.isfinite(v) for v in vals)
            ok = [v for v in vals if math.isfinite(v)]
            cell = f"{statistics.mean(ok):.4f} ± {statistics.stdev(ok):.4f}" if len(ok) > 1 else (f"{ok[0]:.4f}" if ok else "-")
            cells.append(cell + (f" ({bad} of {len(vals)} diverged)" if bad else "") + ("" if len(vals) == len(SEEDS) else f" [{len(vals)} seeds]"))
        qk = sorted(set(g.qk.values()) or {"none"})
        lines.append(f"| {name.removesuffix('+qk')} | {'/'.join(qk)} | " + " | ".join(cells) + " |")
    if RACES.exists():
        with open(RACES, newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                lines.append(f"\nrace at lr {r['lr']} (search seed {r['search_seed']}): {r['verdict']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="tiny Shakespeare's input.txt (read as characters)")
    p.add_argument("--races", action="store_true", help="after the grid, one race per learning rate with QK-norm searched")
    p.add_argument("--search-seed", type=int, default=0)
    p.add_argument("--fresh", action="store_true", help="after the races, each searched answer against the named "
                   "finalist it beat at the fresh seeds 6-8")
    p.add_argument("--lasts", type=int, default=0, metavar="K",
                   help="then each searched answer against the named finalist it beat at K times the budget, fresh seeds 6-8")
    p.add_argument("--report", action="store_true", help="print the grid's table only")
    args = p.parse_args(argv)
    try:
        train_data, val_data, vocab = load_data(args.data)
    except ValueError as exc:
        p.error(f"--data {exc}")
    ensure_qk_column(TABLE)
    if not args.report:
        run_grid((train_data, val_data), vocab)
        if args.races:
            done = set()
            if RACES.exists():
                with open(RACES, newline="", encoding="utf-8") as f:
                    done = {(r["lr"], int(r["search_seed"]), r["rule"]) for r in csv.DictReader(f)}
            for lr in LRS:
                if (f"{lr:g}", args.search_seed, REVISION) not in done:
                    append_csv_row(RACES, RACE_FIELDS, race_lr(lr, args.search_seed, (train_data, val_data), vocab))
        if (args.fresh or args.lasts > 1) and RACES.exists():
            with open(RACES, newline="", encoding="utf-8") as f:
                wins = [r for r in csv.DictReader(f) if r["outcome"] == "searched-wins" and r["rule"] == REVISION]
            for multiplier in [1] * args.fresh + [args.lasts] * (args.lasts > 1):
                for r in wins:
                    print(fresh(r, (train_data, val_data), vocab, multiplier), flush=True)
    print(report(vocab))
    return 0


if __name__ == "__main__":
    sys.exit(main())
