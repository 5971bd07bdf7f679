"""Ground truth in nanoGPT's own model (issue 44, part 1): random genotypes of the seven-candidate
site space retrained with nanoGPT's recipe, kept as data.

The setting is ``experiments/race/own_model.py``'s (``examples/gpt.py``: nanoGPT's ``model.py`` with
the README's diff, ``bias=False``; tiny Shakespeare as characters; nanoGPT's loop and recipe,
``examples/nanogpt_recipe.py``; 4 layers of width 64, block 64, batch 32, 500 steps). The space
is every one of the model's 8 sites (``transformer.h.<i>.attn_site`` / ``mlp_site``) taking one
of ``pre post deepnorm peri outnorm lns none``: ``7^8`` genotypes. Each genotype is derived on a
fresh model (``autoln.derive``, DeepNorm's init gain included) built after
``torch.manual_seed(seed)`` and trained on the batches of ``seed``; its value is the validation
loss in nats per character over every non-overlapping window of the split.

The jobs, in the order run (each finished retrain is a row of ``--table``, reused, never re-run):

1. the named baselines (``all-<candidate>`` for the seven, ``mix-ln``: block 1 Post-LN, the rest
   Pre-LN; ``pre-post``: blocks 1-2 Pre-LN, 3-4 Post-LN) and ``--samples`` distinct genotypes
   drawn uniformly (``autoln.oneshot.fidelity.sample_genotypes``, ``--sample-seed``), at seed 0;
2. the first ``--ceiling`` samples at seed 1: Kendall's tau between seeds 0 and 1 is the
   table's noise ceiling;
3. the ``--top`` best samples (by seed 0) and the named baselines at seeds 1 and 2.

``--report`` prints the table's summary (quantiles, baselines' percentiles, the noise ceiling)
without training::

    OMP_NUM_THREADS=1 python experiments/truth/own_model_truth.py --data input.txt --samples 40 --ceiling 20 --top 5
"""

from __future__ import annotations

import argparse
import csv
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
from gpt import GPT, GPTConfig  # noqa: E402
from nanogpt_recipe import Recipe, load_data, train, val_loss  # noqa: E402

import autoln  # noqa: E402
from autoln.core.io import append_csv_row  # noqa: E402
from autoln.api import searchable_sites  # noqa: E402
from autoln.oneshot.fidelity import sample_genotypes  # noqa: E402

TABLE = ROOT / "experiments" / "own_model_truth.csv"
#: The table's columns; ``qk`` (the QK-norm choice, :mod:`autoln.space.qk`) came last, later: a row
#: without it (written before it existed) has no QK-norm (read as ``none``, :func:`qk_of_row`).
FIELDS = ["space", "name", "genotype", "seed", "steps", "val", "train_s", "setup", "commit", "qk"]


def qk_of_row(row: dict) -> str:
    """A row's QK-norm choice: its ``qk`` column, ``none`` where the row has none (an older row)."""
    return row.get("qk") or "none"


def ensure_qk_column(path: Path = TABLE) -> None:
    """Give the table ``path`` the ``qk`` column in its header when it lacks it (its older rows
    then read as ``none``); the file is replaced atomically, its rows unchanged."""
    import os

    if not path.exists():
        return
    data = path.read_bytes()
    header, sep, rest = data.partition(b"\n")
    end = b"\r" if header.endswith(b"\r") else b""  # the csv module's lines end in \r\n: kept byte for byte
    if header.rstrip(b"\r").split(b",")[-1] == b"qk":
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(header.rstrip(b"\r") + b",qk" + end + sep + rest)
    os.replace(tmp, path)
CANDIDATES = ("pre", "post", "deepnorm", "peri", "outnorm", "lns", "none")
SIZE = dict(n_layer=4, n_embd=64, n_head=4, block_size=64, bias=False)
SETUP = "nanogpt-3adf61e1+diff bias=False shakespeare-char L4 d64 T64 B32"
N_SITES = 2 * SIZE["n_layer"]


def named_genotypes(candidates: tuple[str, ...] = CANDIDATES) -> dict[str, list[str]]:
    """The named baselines as site lists (attn, mlp per block): ``all-<c>`` per candidate,
    ``mix-ln`` (first ``floor(0.25 N + 0.5)`` blocks ``post``, the rest ``pre``; Li et al. 2024) and
    ``pre-post`` (first ``floor(0.5 N + 0.5)`` blocks ``pre``, the rest ``post``), ``N = 4`` blocks."""
    from autoln.models.genotype import named_blocks

    out = {f"all-{c}": [c] * N_SITES for c in candidates}
    if "pre" in candidates and "post" in candidates:
        for name in ("mix-ln", "pre-post"):
            out[name] = [p for p in named_blocks(name, SIZE["n_layer"]) for _ in range(2)]  # attn and mlp site of each block
    return out


def site_genotype(names: list[str], candidates: tuple[str, ...] = CANDIDATES) -> autoln.SiteGenotype:
    """``names`` (one placement per site, in the model's site order) as an :class:`autoln.SiteGenotype`."""
    model = GPT(GPTConfig(**SIZE, vocab_size=65, norm_candidates=candidates))
    sites = [n for n, _ in searchable_sites(model)]
    if len(sites) != len(names):
        raise ValueError(f"expected {len(sites)} placements, got {len(names)}")
    return autoln.SiteGenotype(list(candidates), dict(zip(sites, names)),
                               {s: [1.0 if c == p else 0.0 for c in candidates] for s, p in zip(sites, names)})


def retrain(names: list[str], seed: int, data, vocab: int, recipe: Recipe, candidates: tuple[str, ...] = CANDIDATES) -> tuple[float, float]:
    """The derived model of ``names`` trained with ``recipe`` at ``seed``: ``(val nats/char, seconds)``."""
    genotype = site_genotype(names, candidates)
    torch.manual_seed(seed)
    model = autoln.derive(GPT(GPTConfig(**SIZE, vocab_size=vocab, norm_candidates=candidates)), genotype)
    t0 = time.perf_counter()
    train(model, data[0], SIZE["block_size"], recipe, seed)
    return val_loss(model, data[1], SIZE["block_size"]), time.perf_counter() - t0


def current_commit() -> str:
    """The repository's HEAD (12 hex digits), ``unknown`` outside git."""
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def read_table(path: Path, space: str) -> dict[tuple[str, int, int], dict]:
    """Finished rows of ``space`` in this set-up, by ``(genotype, seed, steps)``."""
    if not path.exists():
        return {}
    with open(path, newline="", encoding="utf-8") as f:
        return {(r["genotype"], int(r["seed"]), int(r["steps"])): r for r in csv.DictReader(f)
                if r["setup"] == SETUP and r["space"] == space}


def append_row(path: Path, row: dict) -> None:
    """Append one finished retrain to the CSV ``path`` (header first if new), synced to disk."""
    append_csv_row(path, FIELDS, row)


def report(done: dict, samples: list[str], named: dict[str, list[str]], steps: int) -> str:
    """The table's summary: sample quantiles at seed 0, each named baseline's mean and percentile,
    the best samples at three seeds, and the seeds' Kendall tau (the noise ceiling)."""
    from scipy.stats import kendalltau

    def vals(g: str) -> list[float]:
        return [float(done[(g, s, steps)]["val"]) for s in (0, 1, 2) if (g, s, steps) in done]

    s0 = {g: float(done[(g, 0, steps)]["val"]) for g in samples if (g, 0, steps) in done}
    lines = [f"samples at seed 0: {len(s0)}"]
    if s0:
        v = sorted(s0.values())
        lines.append("quantiles (0, 10, 50, 90, 100 %): " + ", ".join(f"{v[min(len(v) - 1, int(q * len(v)))]:.4f}" for q in (0, .1, .5, .9, .999)))
    for name, names in named.items():
        g, x = " ".join(names), vals(" ".join(names))
        if x:
            pct = 100 * sum(o > x[0] for o in s0.values()) / max(1, len(s0))
            lines.append(f"{name:14s} {statistics.mean(x):.4f} ± {statistics.stdev(x) if len(x) > 1 else float('nan'):.4f} "
                         f"({len(x)} seeds; seed 0 beats {pct:.0f} % of the sample)")
    both = [g for g in s0 if (g, 1, steps) in done]
    if len(both) >= 2:
        tau = kendalltau([s0[g] for g in both], [float(done[(g, 1, steps)]["val"]) for g in both]).statistic
        lines.append(f"noise ceiling: Kendall tau(seed 0, seed 1) = {tau:.3f} over {len(both)} genotypes")
    for g in sorted(s0, key=s0.get)[:5]:
        x = vals(g)
        lines.append(f"top: {g}  {statistics.mean(x):.4f} over {len(x)} seeds")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="tiny Shakespeare's input.txt (read as characters) or a nanoGPT data folder")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--sample-seed", type=int, default=0)
    p.add_argument("--ceiling", type=int, default=20, help="samples retrained at seed 1 too (the noise ceiling)")
    p.add_argument("--top", type=int, default=5, help="best samples retrained at seeds 1 and 2")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--table", type=Path, default=TABLE)
    p.add_argument("--report", action="store_true", help="print the summary of the table only")
    args = p.parse_args(argv)
    try:
        train_data, val_data, vocab = load_data(args.data)
    except ValueError as exc:
        p.error(f"--data {exc}")
    space = "+".join(CANDIDATES)
    recipe = Recipe(steps=args.steps)
    named = named_genotypes()
    samples = [" ".join(s) for s in sample_genotypes(args.samples, N_SITES, CANDIDATES, args.sample_seed)]
    done = read_table(args.table, space)
    if not args.report:
        commit = current_commit()

        def run(name: str, g: str, seed: int) -> None:
            if (g, seed, args.steps) in done:
                return
            val, secs = retrain(g.split(), seed, (train_data, val_data), vocab, recipe)
            row = {"space": space, "name": name, "genotype": g, "seed": seed, "steps": args.steps, "val": f"{val:.6f}",
                   "train_s": f"{secs:.1f}", "setup": SETUP, "commit": commit}
            append_row(args.table, row)
            done[(g, seed, args.steps)] = row
            print(f"[truth] {name} seed {seed}: {g}  val {val:.4f}  ({secs:.0f} s)", file=sys.stderr, flush=True)

        for name, names in named.items():
            run(name, " ".join(names), 0)
        for i, g in enumerate(samples):
            run(f"sample{i:02d}", g, 0)
        for i, g in enumerate(samples[:args.ceiling]):
            run(f"sample{i:02d}", g, 1)
        best = sorted(samples, key=lambda g: float(done[(g, 0, args.steps)]["val"]))[:args.top]
        for seed in (1, 2):
            for g in best:
                run(f"sample{samples.index(g):02d}", g, seed)
            for name, names in named.items():
                run(name, " ".join(names), seed)
    print(report(done, samples, named, args.steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
