"""How well does a supernet variant rank placements in autoln's own model? (issue 44, part 3)

The ``shallow`` setting of ``experiments/validate.py`` over the seven candidates, judged against
its ground truth in ``experiments/retrains.csv`` (``experiments/ground_truth.py``'s uniform
sample, :func:`race_replay.random_sample`, and the named placements, each retrained at seed 0 at
the full budget): per (variant, search seed) the variant's search runs in
``<out>/shallow/fidelity7/<variant>-seed<s>`` (reused when finished, resumed when stopped;
``softmax`` reuses the race's own search ``<out>/shallow/race7/search-seed<s>`` when it is there),
then its trained supernet (the checkpoint of its last bilevel step) scores every table genotype
one-hot on ``--windows`` validation windows (:func:`ground_truth.supernet_scores`, converted to
bits per byte), and the row gives the figures of ``experiments/own_model_fidelity.py`` (its
``FIELDS``, the same meanings): Kendall's tau against the retrained valid bits per byte, the
top-10 % hits, the read-off's percentile in the random sample (its seed-0 retrain a table row,
run when missing), the fit gap, and each candidate's output RMS and share at the first site.

Variants: ``own_model_fidelity.py``'s (``softmax``, ``common``, ``spos``, ``fair``,
``softmax-2x``, ``softmax-4x``), as ``--set`` overrides of ``search`` here. One row per (variant,
search seed) in ``experiments/shallow_fidelity.csv``, reused on a re-run::

    OMP_NUM_THREADS=1 python experiments/shallow_fidelity.py --data $D --variants softmax,common,spos,fair --seeds 0,1,2
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ground_truth import supernet_scores  # noqa: E402
from own_model_fidelity import FIELDS  # noqa: E402
from race import TableRetrains  # noqa: E402
from race_replay import random_sample  # noqa: E402
from retrain_table import read_table  # noqa: E402
from validate import add_common_arguments, base_overrides, setting_config  # noqa: E402

from autoln.cli import OneLineParser, guarded  # noqa: E402
from autoln.io import append_csv_row  # noqa: E402

OUT = Path(__file__).resolve().parent / "shallow_fidelity.csv"
SEVEN = "model.candidates=[pre, post, deepnorm, peri, outnorm, lns, none]"


def variant_overrides(variant: str, search_steps: int, warmup: int, arch_warmup: int) -> list[str]:
    """The ``--set`` overrides of ``variant`` (module docstring).

    Raises:
        KeyError: an unknown variant."""
    longer = {f"softmax-{k}x": [f"search.steps={k * search_steps}", f"search.warmup_steps={k * warmup}",
                                f"search.arch_warmup_steps={k * arch_warmup}"] for k in (2, 4)}
    return {"softmax": [], "common": ["search.candidate_scale=common"], "spos": ["search.weight_mode=spos"],
            "fair": ["search.weight_mode=fair"], **longer}[variant]


def truth(rows, cfg, space: str) -> tuple[dict[str, float], list[str]]:
    """The seed-0 valid bits per byte at the full budget of the random sample and the named
    placements (by placements), and the random sample's genotypes."""
    from autoln.genotype import baseline
    from autoln.run_race import named_specs

    full = {r.genotype: r.valid for r in rows if (r.setting, r.space, r.seed, r.steps) == ("shallow", space, cfg.retrain.seed,
                                                                                            cfg.retrain.steps)}
    cands = cfg.model.searched_candidates()
    sample = random_sample(set(full), cands, cfg.model.n_layers, 0)
    named = [baseline(n, cfg.model, 256).describe() for n in named_specs(cands)]
    return {g: full[g] for g in [*sample, *named] if g in full}, sample


def search_dir(cfg, out: Path, variant: str, seed: int) -> Path:
    """The variant's search folder, run or resumed when not finished (module docstring)."""
    from autoln.run_search import run_search

    reuse = out / "shallow" / "race7" / f"search-seed{seed}"
    if variant == "softmax" and (reuse / "genotype.json").exists():
        return reuse
    folder = out / "shallow" / "fidelity7" / f"{variant}-seed{seed}"
    if not (folder / "genotype.json").exists():
        resume = (folder / "checkpoint.pt").exists()
        run_search(cfg, folder, overwrite=not resume, resume=resume)
    return folder


def first_site(folder: Path) -> dict:
    """Each candidate's output RMS and share at the trained supernet's first site on 16 windows."""
    import torch

    from autoln.checkpoint import CHECKPOINT_FILE
    from autoln.config import load_config
    from autoln.data import eval_starts, load_corpus
    from autoln.model import candidate_scales
    from autoln.supernet import Supernet

    cfg = load_config(folder / "config.yaml")
    corpus = load_corpus(cfg.data)
    net = Supernet(cfg.model, corpus.vocab_size, mixing=cfg.search.mixing, candidate_scale=cfg.search.candidate_scale)
    net.load_state_dict(torch.load(folder / CHECKPOINT_FILE, map_location="cpu", weights_only=True)["model"])
    valid, t = corpus.splits["valid"], cfg.model.context
    x = torch.stack([torch.from_numpy(valid[s:s + t].astype("int64")) for s in eval_starts(len(valid), t, 16)])
    scales = candidate_scales(net, x, lambda x: net(x))
    return scales[sorted(scales)[0]]


def measure(variant: str, seed: int, args) -> dict:
    """One row (module docstring)."""
    from scipy.stats import kendalltau

    from autoln.genotype import Genotype
    from autoln.run_race import job_config
    from autoln.race import Job

    common = [SEVEN, *base_overrides(args), f"search.seed={seed}", "race.enabled=false"]
    s = setting_config("shallow", common, args.config).search
    cfg = setting_config("shallow", [*common, *variant_overrides(variant, s.steps, s.warmup_steps, s.arch_warmup_steps)],
                         args.config)
    space = "+".join(cfg.model.searched_candidates())
    values, sample = truth(read_table(args.table), cfg, space)
    genotypes = list(values)
    t0 = time.perf_counter()
    folder = search_dir(cfg, Path(args.out), variant, seed)
    search_s = time.perf_counter() - t0
    scores = dict(zip(genotypes, (v / math.log(2) for v in supernet_scores(folder, [g.split() for g in genotypes], args.windows))))
    k = max(1, math.ceil(0.1 * len(genotypes)))
    best_true, best_pred = set(sorted(genotypes, key=values.get)[:k]), set(sorted(genotypes, key=scores.get)[:k])
    tau = float(kendalltau([scores[g] for g in genotypes], [values[g] for g in genotypes]).statistic)
    gaps = [scores[g] - values[g] for g in genotypes]
    read_off = Genotype.load(folder / "genotype.json")
    placements = read_off.describe()
    from autoln.data import load_corpus

    retrains = TableRetrains("shallow", space, args.table, Path(args.out) / "shallow" / "fidelity7" / "retrains",
                             load_corpus(cfg.data).fingerprint)
    jcfg = job_config(cfg, Job(placements, cfg.retrain.steps, 0))
    run_dir = Path(args.out) / "shallow" / "fidelity7" / "retrains" / placements.replace(" ", "_")
    read_off_val = retrains.value(jcfg, placements, str(folder / "genotype.json"), placements, run_dir)
    pool = [values[g] for g in sample]
    pct = 100 * (sum(v > read_off_val for v in pool) + 0.5 * sum(v == read_off_val for v in pool)) / len(pool)
    first = first_site(folder)
    return {"variant": variant, "search_seed": seed, "tau": f"{tau:.4f}", "hits": len(best_true & best_pred), "of": k,
            "n": len(genotypes), "read_off": placements, "read_off_val": f"{read_off_val:.4f}", "read_off_pct": f"{pct:.1f}",
            "gap_mean": f"{statistics.mean(gaps):.4f}", "gap_sd": f"{statistics.stdev(gaps):.4f}",
            "truth_sd": f"{statistics.stdev(values.values()):.4f}",
            "first_site_rms": " ".join(f"{c}:{v:.3f}" for c, v in first["rms"].items()),
            "first_site_share": " ".join(f"{c}:{v:.3f}" for c, v in first["share"].items()), "search_s": f"{search_s:.1f}",
            "commit": retrains.commit}


def main(argv=None) -> int:
    p = OneLineParser(prog="shallow_fidelity.py", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, "shallow")
    p.add_argument("--variants", default="softmax,common,spos,fair")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--windows", type=int, default=256, help="validation windows of the one-hot scores")
    p.add_argument("--rows", type=Path, default=OUT, help="the results table (one row per variant and search seed)")
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    for v in variants:
        if v not in ("softmax", "common", "spos", "fair", "softmax-2x", "softmax-4x"):
            p.error(f"--variants: unknown variant {v!r}")
    have = set()
    if args.rows.exists():
        with open(args.rows, newline="", encoding="utf-8") as f:
            have = {(r["variant"], int(r["search_seed"])) for r in csv.DictReader(f)}

    def body() -> None:
        for seed in (int(s) for s in args.seeds.split(",")):
            for variant in variants:
                if (variant, seed) in have:
                    continue
                row = measure(variant, seed, args)
                append_csv_row(args.rows, FIELDS, row)
                print(f"[fidelity] shallow-7 {variant} seed {seed}: tau {row['tau']}, hits {row['hits']}/{row['of']}, read-off "
                      f"{row['read_off']} {row['read_off_val']} ({row['read_off_pct']} %), gap {row['gap_mean']} ± "
                      f"{row['gap_sd']} (truth sd {row['truth_sd']})", flush=True)

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
