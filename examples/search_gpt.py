"""Search the norm placement of nanoGPT's model (examples/gpt.py) with autoln's public API, then
race the supernet's shortlist against the model's own Pre-LN and the named placements, each
trained by nanoGPT's own recipe.

    python examples/search_gpt.py --data input.txt [--out runs/example]

``--data``: a text file read as characters (nanoGPT's ``shakespeare_char`` preparation; e.g.
tiny Shakespeare's ``input.txt``) or a nanoGPT data folder (``train.bin``, ``val.bin``,
``meta.pkl``); the default is this repository's README, enough to see it run, too small for an
answer worth keeping. The defaults are nanoGPT's model at 4 layers of width 64, block 64, and
``examples/nanogpt_recipe.py``'s loop (AdamW lr 1e-3, 100 warm-up steps, cosine to 1e-4, clip
1.0, batch 32, 500 steps). It writes ``<out>/supernet_genotype.json`` (the supernet's read-off,
with its shortlist), ``<out>/genotype.json`` (the race's answer) and ``<out>/race.json`` (every
retrain of the race and the verdict). It prints the search's progress, then the race's: a bar
on a terminal, or in a redirected log a line per retrain with its validation loss (nats per
character, or per token for a data folder, over every non-overlapping window) and the time left
at most; then the verdict. At the defaults it takes 5.5 to 8 minutes with one CPU thread (the
search about 2.5, the race's up to 18 retrains of up to 500 steps the rest).

The race (``autoln.race_genotypes``, the rule of ``search.py``'s race): the read-off, its argmax
and the shortlist against ``all-pre`` (the model's own, always a finalist), ``all-post``,
``all-deepnorm``, ``mix-ln`` and ``pre-post``: the searched entries pruned at 56 steps (and at 167
when 4 or more are distinct; the printout's ``rungs:`` says which run),
every named placement at the full 500 steps, then the best of each kind seed by seed, 3 to 6
seeds; a searched genotype is the answer only if it beats the best named one by the
group-sequential paired t-test of docs/race.md (false-win rate 0.05 over its looks). On tiny Shakespeare the supernet alone answers
worse than the model's own Pre-LN (2.439 ± 0.017 nats per character against 2.318 ± 0.014,
``experiments/own_model.csv``); the race's answers and their fresh-seed checks are in
``experiments/own_model_race.csv``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt import GPT, GPTConfig  # noqa: E402
from nanogpt_recipe import Recipe, batches, load_data, train, val_loss  # noqa: E402

import autoln  # noqa: E402
from autoln.core.io import write_json_atomic  # noqa: E402

CANDIDATES = ("pre", "post", "deepnorm")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "README.md"))
    p.add_argument("--search-steps", type=int, default=None, help="bilevel steps (default: search.py's 500)")
    p.add_argument("--retrain-steps", type=int, default=Recipe.steps)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=Recipe.batch_size)
    p.add_argument("--out", default="runs/example")
    args = p.parse_args(argv)
    try:
        train_data, val_data, vocab = load_data(args.data)
    except ValueError as exc:
        p.error(f"--data {exc}")
    if min(len(train_data), len(val_data)) < 4 * (args.block_size + 2):
        p.error(f"--data {args.data}: too short for windows of {args.block_size} tokens in both splits")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    recipe = replace(Recipe(), steps=args.retrain_steps, batch_size=args.batch_size,
                     warmup=min(Recipe.warmup, args.retrain_steps // 5))
    size = dict(block_size=args.block_size, vocab_size=vocab, n_layer=args.n_layer, n_head=4, n_embd=args.n_embd, bias=False)

    unit = "nats/token" if Path(args.data).is_dir() else "nats/char"  # val_loss: the mean cross-entropy per token

    def build() -> GPT:
        with contextlib.redirect_stdout(io.StringIO()):  # nanoGPT prints its size for every model: once is enough
            return GPT(GPTConfig(**size, norm_candidates=CANDIDATES))

    # 1. search: every site mixes the candidates; autoln trains the weights and the alphas bilevel
    torch.manual_seed(0)
    supernet = GPT(GPTConfig(**size, norm_candidates=CANDIDATES))
    half = len(train_data) // 2  # DARTS' split: weights on one half, alphas on the other
    outcome = autoln.search(supernet, batches(train_data[:half], args.block_size, args.batch_size, 1), steps=args.search_steps,
                            arch_batches=batches(train_data[half:], args.block_size, args.batch_size, 2))
    outcome.genotype.save(out / "supernet_genotype.json")
    print(f"supernet's read-off: {outcome.genotype.describe()}  ({out / 'supernet_genotype.json'})")

    # 2. the race: the shortlist against the model's own Pre-LN and the named placements, each
    #    trained from scratch by nanoGPT's loop at the rung's length (the named ones at the full
    #    budget), the finalists at 3 seeds
    def train_for(model, seed, steps):
        rung = replace(recipe, steps=steps, warmup=round(recipe.warmup * steps / recipe.steps))  # the recipe's schedule, scaled to the rung
        train(model, train_data, args.block_size, rung, seed)

    race = autoln.race_genotypes(build, outcome.genotype, train=train_for, evaluate=lambda model: val_loss(model, val_data, args.block_size),
                                 steps=recipe.steps, own="pre", unit=unit)
    race.genotype.save(out / "genotype.json")
    write_json_atomic(out / "race.json", race.record)
    print(f"wrote {out / 'genotype.json'} (the answer: {race.verdict.answer.name}, {race.genotype.describe()}), "
          f"{out / 'race.json'}")  # the verdict line is the race's last line above
    return 0


if __name__ == "__main__":
    sys.exit(main())
