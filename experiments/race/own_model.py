"""Your own model, tried for real: does the API's answer hold against a nanoGPT model's own Pre-LN?

The model is ``examples/gpt.py`` (nanoGPT's ``model.py`` with the README's diff: its init
N(0, 0.02), branch output projections at 0.02/sqrt(2N); ``bias=False`` as nanoGPT's
``shakespeare_char`` config), the data tiny Shakespeare as characters (nanoGPT's
``shakespeare_char`` preparation), the training nanoGPT's loop and recipe
(``examples/nanogpt_recipe.py``: AdamW lr 1e-3, 100 warm-up steps, cosine to 1e-4, clip 1.0),
4 layers of width 64, block 64, batch 32, 500 steps. Each variant searches with
``autoln.search`` (search seed s), derives a fresh model from the answer and trains it with the
recipe (seed s); the baselines are the model's own placement (``pre``) and the other uniform
placements, trained the same way. Lower is better: validation loss in nats per character over
every non-overlapping window of the split.

Variants (the suspects of the issue, each measured, none assumed):

- ``readme``: ``autoln.search(model, train, steps=300, arch_batches=alpha)`` as the README
  wrote it before (the API's default schedule then, written out: warm-ups 30 and 60);
- ``cli``: ``search.py``'s default schedule (500 steps, warm-ups 50 and 100);
- ``cli-lr``: the same with the model's own learning rate (1e-3) instead of the search's 2e-3;
- ``cli-argmax``: ``cli``'s supernet read off by argmax of its final probabilities instead of
  the perturbation selection (the same search: the read-off comes after it);
- ``cli-noinit``: ``cli``'s answer derived without DeepNorm's init gain on top of nanoGPT's
  already scaled projections (``derive(..., init=False)``);
- ``spos-score`` and ``fair-score``: a supernet trained one path at a time (SPOS's uniformly
  drawn path, or FairNAS's every candidate once per step), read off by the supernet's loss
  with each whole genotype imposed one-hot (``search.selection: score``). Not a suspect of the
  issue but the test of the reason found: nanoGPT's embeddings start at std 0.02, so in the
  mixed supernet the normed candidates' outputs (post, deepnorm: RMS 1) outweigh ``pre``'s
  (the stream, RMS 0.03) 35 to 1 at the first site and normalise the stream for every later
  site, which no Pre-LN derived model sees; a one-path supernet keeps each path's own scale.

Each search's answer is kept as ``experiments/own_model/<search>_seed<s>.json`` (a site
genotype with its probabilities), so the derived variants and a rerun reuse it.

``input.txt`` is tiny Shakespeare (Karpathy's char-rnn data, the file nanoGPT's
``data/shakespeare_char/prepare.py`` downloads: 1,115,394 characters). Every finished run is a
row of ``experiments/own_model.csv`` (reused, never re-run)::

    OMP_NUM_THREADS=1 python experiments/race/own_model.py --data input.txt \
        --variants cli,cli-noinit,cli-argmax,readme,cli-lr,spos-score,fair-score --baselines pre,post,deepnorm --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from gpt import GPT, GPTConfig  # noqa: E402
from nanogpt_recipe import Recipe, batches, load_data, train, val_loss  # noqa: E402

import autoln  # noqa: E402
from autoln.core.io import append_csv_row  # noqa: E402

TABLE = ROOT / "experiments" / "own_model.csv"
FIELDS = ["variant", "seed", "genotype", "val", "search_steps", "search_s", "train_s", "setup"]
CANDIDATES = ("pre", "post", "deepnorm")
SIZE = dict(n_layer=4, n_embd=64, n_head=4, block_size=64, bias=False)
SETUP = "nanogpt-3adf61e1+diff bias=False shakespeare-char L4 d64 T64 B32 500 steps"
ANSWERS = ROOT / "experiments" / "own_model"
#: variant -> (the search it reads, how: "selection" | "argmax" | "noinit")
READS = {"readme": ("readme", "selection"), "cli": ("cli", "selection"), "cli-lr": ("cli-lr", "selection"),
         "cli-argmax": ("cli", "argmax"), "cli-noinit": ("cli", "noinit"),
         "spos-score": ("spos-score", "selection"), "fair-score": ("fair-score", "selection")}


def search_settings(search: str) -> autoln.SearchConfig:
    """The search settings of ``search`` (``readme``, ``cli``, ``cli-lr``; see the module's docstring).

    Raises:
        KeyError: an unknown search."""
    cli = autoln.SearchConfig()
    return {
        "readme": autoln.SearchConfig(steps=300, warmup_steps=30, arch_warmup_steps=60),
        "cli": cli,
        "cli-lr": replace(cli, lr=1e-3),
        "spos-score": replace(cli, weight_mode="spos", selection="score"),
        "fair-score": replace(cli, weight_mode="fair", selection="score"),
    }[search]


def read_table(path: Path) -> dict[tuple[str, int], dict]:
    """The finished runs of this set-up in the CSV ``path``, by ``(variant, seed)`` (none when absent)."""
    if not path.exists():
        return {}
    with open(path, newline="", encoding="utf-8") as f:
        return {(r["variant"], int(r["seed"])): r for r in csv.DictReader(f) if r.get("setup") == SETUP}


def append_row(path: Path, row: dict) -> None:
    """Append one finished run (``FIELDS``) to the CSV ``path``, header first if new, synced to disk."""
    append_csv_row(path, FIELDS, row)


def trained(cfg: GPTConfig, data, recipe: Recipe, seed: int, genotype=None, init: bool = True) -> tuple[float, float]:
    """Build (seed ``seed``), derive when a genotype is given, train; ``(val loss, seconds)``."""
    train_data, val_data = data
    torch.manual_seed(seed)
    model = GPT(cfg)
    if genotype is not None:
        autoln.derive(model, genotype, init=init)
    t0 = time.perf_counter()
    train(model, train_data, cfg.block_size, recipe, seed)
    return val_loss(model, val_data, cfg.block_size), time.perf_counter() - t0


def searched(search: str, seed: int, data, vocab: int, recipe: Recipe, answers: Path) -> autoln.SiteGenotype:
    """The answer of ``search`` at search seed ``seed`` (D_w and D_alpha the two halves of the
    training split, DARTS' split): read from ``answers`` when kept, else searched and kept there
    (its provenance's ``wall_time_s`` is the search's seconds)."""
    path = answers / f"{search}_seed{seed}.json"
    if path.exists():
        return autoln.SiteGenotype.load(path)
    cfg = search_settings(search)
    train_data = data[0]
    half = len(train_data) // 2
    torch.manual_seed(seed)
    supernet = GPT(GPTConfig(**SIZE, vocab_size=vocab, norm_candidates=CANDIDATES))
    outcome = autoln.search(supernet, batches(train_data[:half], SIZE["block_size"], recipe.batch_size, 2 * seed + 1),
                            arch_batches=batches(train_data[half:], SIZE["block_size"], recipe.batch_size, 2 * seed + 2),
                            steps=cfg.steps, cfg=cfg, seed=seed, progress=False)
    answers.mkdir(parents=True, exist_ok=True)
    outcome.genotype.save(path)
    return outcome.genotype


def argmax_of(genotype: autoln.SiteGenotype) -> autoln.SiteGenotype:
    """The genotype read off ``genotype``'s final probabilities by argmax (DARTS' read-off)."""
    sites = {n: genotype.candidates[max(range(len(p)), key=p.__getitem__)] for n, p in genotype.probabilities.items()}
    return replace(genotype, sites=sites, provenance=dict(genotype.provenance, selection="argmax"))


def run_variant(variant: str, seed: int, data, vocab: int, recipe: Recipe, answers: Path = ANSWERS) -> dict:
    """The search ``variant`` reads (:data:`READS`; searched once, kept in ``answers``), read off
    as the variant says, derived on a fresh model (seed ``seed``) and trained with the recipe;
    the table row (``val`` in nats per character, times in seconds)."""
    search, how = READS[variant]
    genotype = searched(search, seed, data, vocab, recipe, answers)
    if how == "argmax":
        genotype = argmax_of(genotype)
    val, train_s = trained(GPTConfig(**SIZE, vocab_size=vocab, norm_candidates=CANDIDATES), data, recipe, seed, genotype,
                           init=how != "noinit")
    return {"variant": variant, "seed": seed, "genotype": genotype.describe(), "val": f"{val:.6f}",
            "search_steps": genotype.provenance.get("steps"), "search_s": f"{genotype.provenance.get('wall_time_s', 0):.1f}",
            "train_s": f"{train_s:.1f}", "setup": SETUP}


def run_baseline(placement: str, seed: int, data, vocab: int, recipe: Recipe) -> dict:
    """The model with ``placement`` at every site, trained with the recipe at ``seed``; the table row."""
    val, train_s = trained(GPTConfig(**SIZE, vocab_size=vocab, norm_candidates=(placement,)), data, recipe, seed)
    return {"variant": f"all-{placement}", "seed": seed, "genotype": placement, "val": f"{val:.6f}", "search_steps": 0,
            "search_s": "0", "train_s": f"{train_s:.1f}", "setup": SETUP}


def summary(rows: dict[tuple[str, int], dict]) -> str:
    """A Markdown table of the rows' validation loss per variant (mean ± std over seeds, best first)."""
    by: dict[str, list[float]] = {}
    for (variant, _), r in sorted(rows.items()):
        by.setdefault(variant, []).append(float(r["val"]))
    lines = ["| variant | seeds | val (nats/char), mean ± std | per seed |", "|---|---|---|---|"]
    for variant, vals in sorted(by.items(), key=lambda kv: statistics.mean(kv[1])):
        sd = statistics.stdev(vals) if len(vals) > 1 else float("nan")
        lines.append(f"| {variant} | {len(vals)} | {statistics.mean(vals):.4f} ± {sd:.4f} | {' / '.join(f'{v:.4f}' for v in vals)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="tiny Shakespeare's input.txt (read as characters) or a nanoGPT data folder")
    p.add_argument("--variants", default="readme,cli")
    p.add_argument("--baselines", default="pre,post,deepnorm")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--table", type=Path, default=TABLE)
    p.add_argument("--answers", type=Path, default=ANSWERS, help="folder of the searches' answers (kept, reused)")
    args = p.parse_args(argv)
    known = tuple(READS)
    unknown = [v for v in args.variants.split(",") if v and v not in known]
    if unknown:
        p.error(f"--variants: unknown {unknown}; expected some of {', '.join(known)}")
    try:
        train_data, val_data, vocab = load_data(args.data)
    except ValueError as exc:
        p.error(f"--data {exc}")
    data, recipe = (train_data, val_data), Recipe()
    seeds = [int(s) for s in args.seeds.split(",")]
    done = read_table(args.table)
    jobs = [("baseline", b, s) for b in args.baselines.split(",") if b for s in seeds]
    jobs += [("variant", v, s) for s in seeds for v in args.variants.split(",") if v]  # a search's readers together
    for kind, name, seed in jobs:
        key = (f"all-{name}" if kind == "baseline" else name, seed)
        if key in done:
            continue
        row = run_baseline(name, seed, data, vocab, recipe) if kind == "baseline" else run_variant(name, seed, data, vocab, recipe, args.answers)
        append_row(args.table, row)
        done[key] = row
        print(f"[own model] {key[0]} seed {seed}: {row['genotype']}  val {row['val']}", file=sys.stderr, flush=True)
    print(summary({k: v for k, v in done.items() if k[1] in seeds}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
