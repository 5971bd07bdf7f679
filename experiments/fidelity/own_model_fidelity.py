"""How well does a supernet variant rank placements in nanoGPT's own model? (issue 44, part 3)

Each variant's supernet is trained by ``autoln.search`` in ``experiments/race/own_model.py``'s setting
(seven candidates at each of the 8 sites, ``search.py``'s default schedule, D_w and D_alpha the
two halves of the training split, search seed ``s``), and then judged against the ground truth of
``experiments/own_model_truth.csv`` (its 40 sampled genotypes and the named placements, each
retrained at seed 0 with nanoGPT's recipe):

- ``tau``: Kendall's tau between the trained supernet's one-hot loss of each table genotype (its
  loss, nats per character, on the first ``--windows`` windows of the validation split with the
  genotype imposed one-hot) and the genotype's retrained loss;
- ``hits``: how many of the table's best 10 % are among the supernet's best 10 %;
- the read-off's percentile: the share of the random sample whose seed-0 loss is worse than the
  read-off's (the read-off retrained at seed 0, a row of the table);
- the fit: the mean and spread of (one-hot loss - retrained loss) over the table's genotypes,
  beside the spread of the retrained losses (a gap far above that spread says the shared
  weights fit no single path);
- the scales: each candidate's output RMS and share of the mixture at the trained supernet's
  first site (``autoln.models.site.candidate_scales`` on 16 validation windows).

Variants (``--variants``): ``softmax`` (today's mixing), ``common`` (``search.candidate_scale:
common``, each candidate brought to the mixture's RMS), ``spos`` and ``fair`` (single-path
weight steps, SPOS and FairNAS), ``softmax-2x`` and ``softmax-4x`` (the supernet trained 2 and
4 times as long), ``split`` (one sub-supernet per kind of residual stream, the better one's
answer: :func:`measure_split`). One row per (variant, search seed) in ``experiments/own_model_fidelity.csv``,
reused on a re-run::

    OMP_NUM_THREADS=1 python experiments/fidelity/own_model_fidelity.py --data input.txt --variants softmax,common,spos,fair --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))  # for experiments.*
from gpt import GPT, GPTConfig  # noqa: E402
from nanogpt_recipe import Recipe, batches, load_data  # noqa: E402
from experiments.race.own_model_race import Trainer  # noqa: E402
from experiments.truth.own_model_truth import CANDIDATES, SETUP, SIZE  # noqa: E402
from experiments.truth.own_model_truth import TABLE as TRUTH  # noqa: E402

import autoln  # noqa: E402
from autoln.core.io import append_csv_row  # noqa: E402
from autoln.models.site import candidate_scales  # noqa: E402

OUT = ROOT / "experiments" / "own_model_fidelity.csv"
FIELDS = ["variant", "search_seed", "tau", "hits", "of", "n", "read_off", "read_off_val", "read_off_pct", "gap_mean", "gap_sd",
          "truth_sd", "first_site_rms", "first_site_share", "search_s", "commit"]


def variant_config(variant: str) -> autoln.SearchConfig:
    """The search settings of ``variant`` (module docstring).

    Raises:
        KeyError: an unknown variant."""
    cli = autoln.SearchConfig()
    return {"softmax": cli, "common": replace(cli, candidate_scale="common"), "spos": replace(cli, weight_mode="spos"),
            "fair": replace(cli, weight_mode="fair"),
            "softmax-2x": replace(cli, steps=2 * cli.steps, warmup_steps=2 * cli.warmup_steps, arch_warmup_steps=2 * cli.arch_warmup_steps),
            "softmax-4x": replace(cli, steps=4 * cli.steps, warmup_steps=4 * cli.warmup_steps, arch_warmup_steps=4 * cli.arch_warmup_steps),
            "split": cli}[variant]


def truth_values(path: Path = TRUTH, sampled: bool = False) -> dict[str, float]:
    """The ground truth's seed-0 retrained losses at 500 steps, by genotype (site placements,
    space-separated): its random sample and named placements (``own_model_truth.py``'s rows; not
    the races' or these runs' read-offs, so every variant is scored on the same genotypes), or
    only the random sample."""
    named = ("all-", "mix-ln", "pre-post")
    with open(path, newline="", encoding="utf-8") as f:
        return {r["genotype"]: float(r["val"]) for r in csv.DictReader(f) if r["seed"] == "0" and r["steps"] == "500"
                and r["space"] == "+".join(CANDIDATES) and r["setup"] == SETUP
                and (r["name"].startswith("sample") or (not sampled and r["name"].startswith(named)))}


@torch.no_grad()
def one_hot_losses(model: autoln.SearchModel, genotypes: list[str], windows: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
    """The supernet's loss (nats per token) on ``windows`` with each genotype imposed one-hot."""
    model.eval()
    out = {}
    for g in genotypes:
        mix = torch.zeros(len(model.site_names), len(model.candidates))
        for i, p in enumerate(g.split()):
            mix[i, model.candidates.index(p)] = 1.0
        out[g] = float(model(windows[0], windows[1], mix=mix)[1])
    model.train()
    return out


def val_windows(val: np.ndarray, n_windows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``n_windows`` non-overlapping windows of the validation split: inputs and
    targets, each ``(n, block_size)`` int64."""
    t = SIZE["block_size"]
    starts = [i * t for i in range(min(n_windows, (len(val) - 1) // t))]
    x = torch.stack([torch.from_numpy(val[i:i + t].astype(np.int64)) for i in starts])
    y = torch.stack([torch.from_numpy(val[i + 1:i + 1 + t].astype(np.int64)) for i in starts])
    return x, y


def trained_supernet(candidates, cfg: autoln.SearchConfig, seed: int, data, vocab: int):
    """``autoln.search`` of a supernet over ``candidates`` (module docstring) at search seed
    ``seed``: ``(outcome, its supernet in eval-ready form, wall time s)``."""
    half = len(data[0]) // 2
    torch.manual_seed(seed)
    supernet = GPT(GPTConfig(**SIZE, vocab_size=vocab, norm_candidates=tuple(candidates)))
    recipe = Recipe()
    t0 = time.perf_counter()
    outcome = autoln.search(supernet, batches(data[0][:half], SIZE["block_size"], recipe.batch_size, 2 * seed + 1),
                            arch_batches=batches(data[0][half:], SIZE["block_size"], recipe.batch_size, 2 * seed + 2),
                            cfg=cfg, seed=seed, progress=False, shortlist=0)
    outcome.model.projected = {}
    return outcome, outcome.model, time.perf_counter() - t0


def first_site(model, x: torch.Tensor) -> dict:
    """``{"rms", "share"}`` by candidate at the trained supernet's first site (the first
    attention site, ``autoln.models.site.candidate_scales`` on ``x[:16]``)."""
    scales = candidate_scales(model, x[:16], lambda x: model(x))
    return next(v for k, v in scales.items() if k.endswith("transformer.h.0.attn_site"))


def measure(variant: str, seed: int, data, vocab: int, n_windows: int) -> dict:
    """One row (module docstring); ``split`` by :func:`measure_split`."""
    if variant == "split":
        return measure_split(seed, data, vocab, n_windows)
    truth = truth_values()
    outcome, model, search_s = trained_supernet(CANDIDATES, variant_config(variant), seed, data, vocab)
    x, y = val_windows(data[1], n_windows)
    scores = one_hot_losses(model, list(truth), (x, y))
    tr = Trainer(CANDIDATES, data, vocab)
    read_off_val = tr.value(outcome.genotype, 0, Recipe().steps, f"fidelity:{variant}")
    return fidelity_row(variant, seed, scores, truth, outcome.genotype.describe(), read_off_val,
                        list(truth_values(sampled=True).values()), first_site(model, x), search_s, tr.commit)


def measure_split(seed: int, data, vocab: int, n_windows: int) -> dict:
    """The ``split`` row (issue 44, variant b): one sub-supernet per kind of residual stream
    (``autoln.space.placements.stream_groups``: ``pre peri outnorm lns none`` and ``post deepnorm``),
    each searched with today's settings; the one whose read-off scores the lower one-hot loss
    gives the answer. Each table genotype inside one group is scored by that group's supernet;
    tau and the fit gap are over those, the top-10 % hits over the whole table (a genotype of
    mixed streams is one the split cannot answer: ranked last)."""
    from autoln.space.placements import stream_groups

    truth = truth_values()
    x, y = val_windows(data[1], n_windows)
    scores, best, search_s = {}, None, 0.0
    for group in stream_groups(CANDIDATES).values():
        outcome, model, secs = trained_supernet(group, autoln.SearchConfig(), seed, data, vocab)
        search_s += secs
        inside = [g for g in truth if set(g.split()) <= set(group)]
        own = one_hot_losses(model, [*inside, outcome.genotype.describe()], (x, y))
        scores.update({g: own[g] for g in inside})
        if best is None or own[outcome.genotype.describe()] < best[0]:
            best = (own[outcome.genotype.describe()], outcome.genotype, first_site(model, x))
    tr = Trainer(CANDIDATES, data, vocab)
    read_off_val = tr.value(best[1], 0, Recipe().steps, "fidelity:split")
    return split_row(seed, scores, truth, best[1].describe(), read_off_val, list(truth_values(sampled=True).values()),
                     best[2], search_s, tr.commit)


def split_row(seed: int, scores: dict[str, float], truth: dict[str, float], read_off: str, read_off_val: float,
              sample: list[float], first: dict, search_s: float, commit: str) -> dict:
    """:func:`fidelity_row` of the ``split`` variant: tau and the fit gap over the genotypes it
    scores (``n``), the top-10 % hits over all of ``truth`` with the unscored ranked last.

    Raises:
        TableError: fewer than two genotypes both scored and measured."""
    from experiments.common.retrain_table import rank_agreement

    row = fidelity_row("split", seed, scores, {g: truth[g] for g in scores}, read_off, read_off_val, sample, first, search_s,
                       commit)
    whole = rank_agreement({**dict.fromkeys(truth, float("inf")), **scores}, truth)
    return {**row, "hits": whole["hits"], "of": whole["of"]}


def fidelity_row(variant: str, seed: int, scores: dict[str, float], truth: dict[str, float], read_off: str,
                 read_off_val: float, sample: list[float], first: dict, search_s: float, commit: str) -> dict:
    """One table row (module docstring; ``FIELDS``): ``scores`` (genotype -> the supernet's
    one-hot loss) against ``truth`` (genotype -> its seed-0 retrained loss, in the same unit) by
    :func:`retrain_table.rank_agreement` (Kendall's tau, top-10 % hits) and the fit gap; the
    read-off's loss ``read_off_val`` as a percentile of ``sample`` (the random sample's losses,
    :func:`ground_truth.percentile`); ``first``: the first site's ``{"rms", "share"}`` by
    candidate (:func:`autoln.models.site.candidate_scales`); ``search_s``: the search's wall time (s).

    Raises:
        TableError: fewer than two genotypes both scored and measured."""
    from experiments.truth.ground_truth import percentile
    from experiments.common.retrain_table import rank_agreement

    agree = rank_agreement(scores, truth)
    gaps = [scores[g] - truth[g] for g in truth]
    return {"variant": variant, "search_seed": seed, "tau": f"{agree['tau']:.4f}", "hits": agree["hits"], "of": agree["of"],
            "n": agree["n"], "read_off": read_off, "read_off_val": f"{read_off_val:.4f}",
            "read_off_pct": f"{percentile(read_off_val, sample):.1f}", "gap_mean": f"{statistics.mean(gaps):.4f}",
            "gap_sd": f"{statistics.stdev(gaps):.4f}", "truth_sd": f"{statistics.stdev(truth.values()):.4f}",
            "first_site_rms": " ".join(f"{c}:{v:.3f}" for c, v in first["rms"].items()),
            "first_site_share": " ".join(f"{c}:{v:.3f}" for c, v in first["share"].items()), "search_s": f"{search_s:.1f}",
            "commit": commit}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="tiny Shakespeare's input.txt (read as characters)")
    p.add_argument("--variants", default="softmax,common,spos,fair")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--windows", type=int, default=256, help="validation windows of the one-hot scores")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    train_data, val_data, vocab = load_data(args.data)
    have = set()
    if args.out.exists():
        with open(args.out, newline="", encoding="utf-8") as f:
            have = {(r["variant"], int(r["search_seed"])) for r in csv.DictReader(f)}
    for variant in args.variants.split(","):
        variant_config(variant)  # an unknown one fails before any work
    for seed in (int(s) for s in args.seeds.split(",")):
        for variant in args.variants.split(","):
            if (variant, seed) in have:
                continue
            row = measure(variant, seed, (train_data, val_data), vocab, args.windows)
            append_csv_row(args.out, FIELDS, row)
            print(f"[fidelity] {variant} seed {seed}: tau {row['tau']}, hits {row['hits']}/{row['of']}, read-off {row['read_off']} "
                  f"{row['read_off_val']} ({row['read_off_pct']} %), gap {row['gap_mean']} ± {row['gap_sd']} (truth sd {row['truth_sd']})",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
