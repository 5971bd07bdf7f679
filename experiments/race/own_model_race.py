"""The race in nanoGPT's own model (issue 43): the API's search and race, then the answer against
the model's own Pre-LN and the best named placement at fresh seeds.

Setting: ``experiments/race/own_model.py``'s (``examples/gpt.py``, tiny Shakespeare as characters,
nanoGPT's recipe, 4 layers of width 64, 500 steps). Per candidate set (``3``: pre post deepnorm;
``7``: the seven) and search seed ``s``:

1. ``autoln.search`` with ``search.py``'s default schedule (``cli``), D_w and D_alpha the two
   halves of the training split, kept as ``experiments/own_model/race<K>_seed<s>.json`` (the
   answer with its shortlist);
2. ``autoln.race_genotypes`` over its read-off, argmax and shortlist, the named placements and
   the model's own ``pre``, with nanoGPT's loop at each rung's length (its warm-up scaled with the
   length and its cosine ending there: :func:`rung_recipe`) and the validation loss over every
   window (nats per character), race seeds 0, 1, 2;
3. the answer and the best named placement (by the table's seeds 0-2 mean; ``all-pre`` when it
   is the answer) retrained at the fresh seeds :data:`FRESH` (6, 7, 8: past every seed of the
   sequential final; rule r2's rows used 3, 4, 5).

Every retrain is a row of ``experiments/own_model_truth.csv`` (the ground truth's table: a
genotype at a seed and a length is one retrain, whoever asked for it) and is reused from it,
so a race is never paid for twice and can be replayed from the table. One row per race goes to
``experiments/own_model_race.csv``::

    OMP_NUM_THREADS=1 python experiments/race/own_model_race.py --data input.txt --candidates 3,7 --search-seeds 0

``--lasts 4`` then retrains each searched answer and its best named placement at 4 times the
budget at the fresh seeds (rows of the same table) and says whether the lead lasts, then gives
the verdict the race itself would with ``race.horizons=[1, 4]`` (seeds 0-2 at the longer budget)
and whether its horizon line agrees with the fresh seeds.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))  # for experiments.*
from gpt import GPT, GPTConfig  # noqa: E402
from nanogpt_recipe import Recipe, batches, load_data, train, val_loss  # noqa: E402
from experiments.truth.own_model_truth import SETUP, SIZE, TABLE, append_row, current_commit  # noqa: E402

import autoln  # noqa: E402
from autoln.api.racing import named_site_genotypes  # noqa: E402
from autoln.core.io import append_csv_row  # noqa: E402
from autoln.race.rule import REVISION, RaceRule  # noqa: E402
from autoln.models.site import Site  # noqa: E402

SETS = {"3": ("pre", "post", "deepnorm"), "7": ("pre", "post", "deepnorm", "peri", "outnorm", "lns", "none")}
RACES = ROOT / "experiments" / "own_model_race.csv"
ANSWERS = ROOT / "experiments" / "own_model"
#: Fresh seeds for the answer's check: past every seed the final can use (``max_seeds``: 6 of rule r3).
FRESH = tuple(range(RaceRule().max_seeds, RaceRule().max_seeds + 3))
RACE_FIELDS = ["candidates", "search_seed", "rule", "read_off", "answer", "answer_genotype", "outcome", "p_value", "verdict",
               "search_s", "race_s", "retrains", "fresh_answer", "fresh_best_named", "best_named", "fresh_pre", "commit"]


def rung_recipe(steps: int, lr: float = Recipe().lr) -> tuple[Recipe, str]:
    """nanoGPT's recipe at ``steps`` and the table's ``setup`` of such a retrain: at a shorter rung
    its schedule's shape kept (the warm-up scaled with the length, as ``search.py``'s race scales
    it; marked ``warmup-scaled``), at the full 500 steps and longer the ground truth's own
    (warm-up 100 steps, the cosine stretched to the end, as ``truth_longer.py`` trains). At a
    peak learning rate ``lr`` other than nanoGPT's 1e-3, ``min_lr`` is a tenth of it (nanoGPT's
    ratio) and the setup says ``lr=<lr>``."""
    full = Recipe()
    setup = SETUP if lr == full.lr else f"{SETUP} lr={lr:g}"
    if steps >= full.steps:
        return Recipe(steps=steps, lr=lr, min_lr=lr / 10), setup
    return Recipe(steps=steps, warmup=round(full.warmup * steps / full.steps), lr=lr, min_lr=lr / 10), f"{setup} warmup-scaled"


def table_values(path: Path = TABLE) -> dict[tuple[str, int, int, str], float]:
    """Every retrain of this set-up in the table: ``(genotype, seed, steps, setup) -> val``."""
    if not path.exists():
        return {}
    with open(path, newline="", encoding="utf-8") as f:
        return {(r["genotype"], int(r["seed"]), int(r["steps"]), r["setup"]): float(r["val"]) for r in csv.DictReader(f)
                if r["setup"].startswith(SETUP)}


def search_answer(cands: tuple[str, ...], seed: int, data, vocab: int, recipe: Recipe, qk: tuple[str, ...] = ("none",),
                  lr: float | None = None, name: str | None = None) -> autoln.SiteGenotype:
    """The API search's answer at ``seed`` (kept in ``ANSWERS`` as ``name``, by default
    ``race<K>_seed<s>``; its wall time in provenance): the placements ``cands`` and the QK-norm
    candidates ``qk`` searched, at the search's default learning rate or ``lr``."""
    path = ANSWERS / f"{name or f'race{len(cands)}_seed{seed}'}.json"
    if path.exists():
        return autoln.SiteGenotype.load(path)
    half = len(data[0]) // 2
    torch.manual_seed(seed)
    supernet = GPT(GPTConfig(**SIZE, vocab_size=vocab, norm_candidates=cands, qk_candidates=qk))
    outcome = autoln.search(supernet, batches(data[0][:half], SIZE["block_size"], recipe.batch_size, 2 * seed + 1),
                            arch_batches=batches(data[0][half:], SIZE["block_size"], recipe.batch_size, 2 * seed + 2),
                            cfg=None if lr is None else autoln.SearchConfig(lr=lr), seed=seed, progress=False)
    ANSWERS.mkdir(parents=True, exist_ok=True)
    outcome.genotype.save(path)
    return outcome.genotype


class Trainer:
    """Retrains of the set-up, read from the table when there and recorded in it when not."""

    def __init__(self, cands: tuple[str, ...], data, vocab: int, qk: tuple[str, ...] = ("none",), lr: float = Recipe().lr) -> None:
        self.cands, self.data, self.vocab, self.qk, self.lr = cands, data, vocab, qk, lr
        self.done = table_values()
        self.commit = current_commit()
        self.spent = 0.0
        self.ran = 0

    def build(self) -> GPT:
        return GPT(GPTConfig(**SIZE, vocab_size=self.vocab, norm_candidates=self.cands, qk_candidates=self.qk))

    def value(self, genotype: autoln.SiteGenotype, seed: int, steps: int, name: str) -> float:
        """The validation loss of ``genotype`` trained at ``seed`` for ``steps`` (table first)."""
        recipe, setup = rung_recipe(steps, self.lr)
        key = (genotype.describe(), seed, steps, setup)
        if key in self.done:
            return self.done[key]
        torch.manual_seed(seed)
        model = autoln.derive(self.build(), genotype)
        t0 = time.perf_counter()
        train(model, self.data[0], SIZE["block_size"], recipe, seed)
        val, secs = val_loss(model, self.data[1], SIZE["block_size"]), time.perf_counter() - t0
        append_row(TABLE, {"space": "+".join(self.cands), "name": name, "genotype": key[0], "seed": seed, "steps": steps,
                           "val": f"{val:.6f}", "train_s": f"{secs:.1f}", "setup": setup, "commit": self.commit,
                           "qk": qk_label(genotype)})
        self.done[key] = float(f"{val:.6f}")
        self.spent += secs
        self.ran += 1
        print(f"[race] {name} seed {seed} at {steps} steps: {key[0]}  val {val:.4f} ({secs:.0f} s)", file=sys.stderr, flush=True)
        return self.done[key]


def placements_of(model) -> dict[str, str]:
    """A derived model's placement per site (each site holds one), in module order."""
    return {n: next(iter(m.placements)) for n, m in model.named_modules() if isinstance(m, Site)}


def qk_of(model) -> dict[str, str]:
    """A derived model's QK-norm choice per attention (each :class:`autoln.QKNorm` holds one), in module order."""
    return {n: m.candidates[0] for n, m in model.named_modules() if isinstance(m, autoln.QKNorm)}


def as_genotype(model, cands: tuple[str, ...], qk: tuple[str, ...] = ("none",)) -> autoln.SiteGenotype:
    """The site genotype a derived ``model`` trains (its placements and, where QK-norm is searched, its QK choices)."""
    choices = qk_of(model) if len(qk) > 1 else {}
    return autoln.SiteGenotype(list(cands), placements_of(model), {}, {}, choices, list(qk) if choices else [], {})


def qk_label(genotype: autoln.SiteGenotype) -> str:
    """The table's ``qk`` column: the one QK choice of every attention (``none`` without any), or ``mixed``."""
    choices = set(genotype.qk.values()) or {"none"}
    return choices.pop() if len(choices) == 1 else "mixed"


def race_one(k: str, seed: int, data, vocab: int) -> dict:
    """One race (module docstring) and its fresh-seed check; the row of ``RACES``."""
    cands = SETS[k]
    recipe = Recipe()
    searched = search_answer(cands, seed, data, vocab, recipe)
    tr = Trainer(cands, data, vocab)

    def train_fn(model, s, steps):  # the table holds the retrain, or it is run and recorded; evaluate reads it
        model.autoln_value = tr.value(as_genotype(model, cands), s, steps, f"race{k}")

    named = named_site_genotypes(tr.build())
    t0 = time.perf_counter()
    outcome = autoln.race_genotypes(tr.build, searched, train=train_fn, evaluate=lambda model: getattr(model, "autoln_value", 0.0),  # 0.0: the API's trial call before training
                                    steps=recipe.steps, own="pre", seed=0, unit="nats/char")
    race_s = time.perf_counter() - t0
    done = tr.done
    named_means = {n: statistics.mean(done[(g.describe(), s, recipe.steps, SETUP)] for s in (0, 1, 2))
                   for n, g in named.items() if all((g.describe(), s, recipe.steps, SETUP) in done for s in (0, 1, 2))}
    best_named = min(named_means, key=named_means.get) if named_means else "all-pre"
    fresh = {}
    for name, g in (("answer", outcome.genotype), ("best_named", named[best_named]), ("pre", named["all-pre"])):
        fresh[name] = [tr.value(g, s, recipe.steps, f"fresh{k}:{name}") for s in FRESH]
    return {"candidates": k, "search_seed": seed, "rule": REVISION, "read_off": searched.describe(), "answer": outcome.verdict.answer.name,
            "answer_genotype": outcome.genotype.describe(), "outcome": outcome.verdict.outcome,
            "p_value": "" if outcome.verdict.p_value is None else f"{outcome.verdict.p_value:.4g}", "verdict": outcome.verdict.line,
            "search_s": f"{searched.provenance.get('wall_time_s', 0):.1f}", "race_s": f"{race_s:.1f}",
            "retrains": len(outcome.values), "fresh_answer": " / ".join(f"{v:.4f}" for v in fresh["answer"]),
            "fresh_best_named": " / ".join(f"{v:.4f}" for v in fresh["best_named"]), "best_named": best_named,
            "fresh_pre": " / ".join(f"{v:.4f}" for v in fresh["pre"]), "commit": tr.commit}


def lasts(k: str, seed: int, multiplier: int, data, vocab: int) -> Optional[str]:
    """Does the lead last? For the rule-r3 race of ``(k, seed)`` in ``RACES`` whose answer is
    searched: the answer and the best named placement retrained at ``multiplier`` times the
    budget (``truth_longer.py``'s recipe: warm-up 100, the cosine stretched) at the fresh seeds
    :data:`FRESH`, rows of the table; then the race's own verdict with ``race.horizons=[1,
    multiplier]`` on the final's seeds and seeds 0-2 at the longer budget
    (``experiments/common/lasts.py``). Returns those lines, or None (no such race)."""
    from autoln.race.verdict import lead_line
    from experiments.common.lasts import agreement, race_horizon
    from experiments.truth.own_model_truth import site_genotype

    with open(RACES, newline="", encoding="utf-8") as f:
        row = next((r for r in csv.DictReader(f) if (r["candidates"], int(r["search_seed"]), r["rule"]) == (k, seed, REVISION)
                    and r["outcome"] == "searched-wins"), None)
    if row is None:
        return None
    tr = Trainer(SETS[k], data, vocab)
    steps = Recipe().steps * multiplier
    answer = site_genotype(row["answer_genotype"].split(), SETS[k])
    named = named_site_genotypes(tr.build())[row["best_named"]]
    a = [tr.value(answer, s, steps, f"lasts{k}:answer") for s in FRESH]
    b = [tr.value(named, s, steps, f"lasts{k}:best_named") for s in FRESH]
    line = f"[lasts] {k} candidates, search seed {seed}, at {steps} steps, fresh seeds {FRESH}: {lead_line(a, b, ('answer', row['best_named']))}"
    best, full = row["best_named"], Recipe().steps

    def value(entry, i, n):  # the final's rows at the budget, the horizon's at ``steps``
        g, who = (answer, "answer") if entry == "searched" else (named, "best_named")
        return tr.value(g, i, n, f"race{k}" if n == full else f"lasts{k}:{who}")

    said = race_horizon(value, answer.describe(), (best, named.describe()), full, multiplier, "nats/char")
    return f"{line}\n[lasts] the race's verdict with race.horizons=[1, {multiplier}]: {said.line}\n[lasts] {agreement(said, a, b)}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="tiny Shakespeare's input.txt (read as characters)")
    p.add_argument("--candidates", default="3,7", help="candidate sets: 3 and/or 7")
    p.add_argument("--search-seeds", default="0")
    p.add_argument("--lasts", type=int, default=0, metavar="K",
                   help="after the races: each searched answer and its best named placement at K times the budget, fresh seeds")
    args = p.parse_args(argv)
    try:
        train_data, val_data, vocab = load_data(args.data)
    except ValueError as exc:
        p.error(f"--data {exc}")
    have = set()
    if RACES.exists():
        with open(RACES, newline="", encoding="utf-8") as f:
            have = {(r["candidates"], int(r["search_seed"]), r["rule"]) for r in csv.DictReader(f)}
    for k in args.candidates.split(","):
        if k not in SETS:
            p.error(f"--candidates: expected 3 or 7, got {k!r}")
        for seed in (int(s) for s in args.search_seeds.split(",")):
            if (k, seed, REVISION) in have:
                continue
            row = race_one(k, seed, (train_data, val_data), vocab)
            append_csv_row(RACES, RACE_FIELDS, row)
            print(f"[race] {k} candidates, search seed {seed}: {row['verdict']}\n  fresh seeds {FRESH}: answer {row['fresh_answer']}, "
                  f"{row['best_named']} {row['fresh_best_named']}, all-pre {row['fresh_pre']}", flush=True)
    if args.lasts > 1:
        for k in args.candidates.split(","):
            for seed in (int(s) for s in args.search_seeds.split(",")):
                line = lasts(k, seed, args.lasts, (train_data, val_data), vocab)
                if line:
                    print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
