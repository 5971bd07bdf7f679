"""How well does a supernet variant rank placements in autoln's own model? (issue 44, part 3)

The ``shallow`` setting of ``experiments/common/validate.py`` over the seven candidates, judged against
its ground truth in ``experiments/retrains.csv`` (``experiments/truth/ground_truth.py``'s uniform
sample, :func:`retrain_table.random_sample`, and the named placements, each retrained at seed 0 at
the full budget): per (variant, search seed) the variant's search runs in
``<out>/shallow/fidelity7/<variant>-seed<s>`` (reused when finished, resumed when stopped;
``softmax`` reuses the race's own search ``<out>/shallow/race7/search-seed<s>`` when it is there),
then its trained supernet (the checkpoint of its last bilevel step) scores every table genotype
one-hot on ``--windows`` validation windows (:func:`ground_truth.supernet_scores`, converted to
bits per byte), and the row gives the figures of ``experiments/fidelity/own_model_fidelity.py`` (its
``FIELDS``, the same meanings): Kendall's tau against the retrained valid bits per byte, the
top-10 % hits, the read-off's percentile in the random sample (its seed-0 retrain a table row,
run when missing), the fit gap, and each candidate's output RMS and share at the first site.

Variants: ``own_model_fidelity.py``'s (``softmax``, ``common``, ``spos``, ``fair``,
``softmax-2x``, ``softmax-4x``, ``split``), as ``--set`` overrides of ``search`` here (``split``:
of ``model.candidates``, one search per kind of residual stream). One row per (variant,
search seed) in ``experiments/shallow_fidelity.csv``, reused on a re-run::

    OMP_NUM_THREADS=1 python experiments/fidelity/shallow_fidelity.py --data $D --variants softmax,common,spos,fair --seeds 0,1,2

The table's noise ceiling, first (``--ceiling N``, default 20, as ``own_model_truth.py``'s): the
first ``N`` genotypes of the random sample retrained at seed 1 too (table rows, reused), and
Kendall's tau between their seed-0 and seed-1 valid bits per byte. Two copies of the command
side by side share those retrains (each takes the ones the other does not hold).
"""

from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
from experiments.truth.ground_truth import supernet_scores, trained_supernet, write_sample  # noqa: E402
from experiments.fidelity.own_model_fidelity import FIELDS, fidelity_row, split_row  # noqa: E402
from experiments.race.race import TableRetrains  # noqa: E402
from experiments.common.retrain_table import random_sample, read_table  # noqa: E402
from experiments.common.validate import add_common_arguments, base_overrides, setting_config  # noqa: E402

from autoln.cli import OneLineParser, guarded  # noqa: E402
from autoln.core.io import append_csv_row  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "shallow_fidelity.csv"
SEVEN = "model.candidates=[pre, post, deepnorm, peri, outnorm, lns, none]"
#: The variants (``own_model_fidelity.variant_config``'s), in the order of :func:`variant_overrides`.
VARIANTS = ("softmax", "common", "spos", "fair", "softmax-2x", "softmax-4x", "split")


def variant_overrides(variant: str, search_steps: int, warmup: int, arch_warmup: int) -> list[str]:
    """The ``--set`` overrides of ``variant`` (module docstring).

    Raises:
        KeyError: an unknown variant."""
    longer = {f"softmax-{k}x": [f"search.steps={k * search_steps}", f"search.warmup_steps={k * warmup}",
                                f"search.arch_warmup_steps={k * arch_warmup}"] for k in (2, 4)}
    return {"softmax": [], "common": ["search.candidate_scale=common"], "spos": ["search.weight_mode=spos"],
            "fair": ["search.weight_mode=fair"], **longer}[variant]


def truth(rows, cfg, space: str) -> tuple[dict[str, float], list[str]]:
    """The seed-0 valid bits per byte at the full budget (``retrain.steps``) of the random
    sample and the named placements, by placements string (those the table holds), and the
    random sample's genotypes (:func:`retrain_table.random_sample`, seed 0). ``rows``: the
    table's :class:`retrain_table.Row` objects."""
    from autoln.models.genotype import baseline
    from autoln.race.run_race import named_specs

    full = {r.genotype: r.valid for r in rows if (r.setting, r.space, r.seed, r.steps) == ("shallow", space, cfg.retrain.seed,
                                                                                            cfg.retrain.steps)}
    cands = cfg.model.searched_candidates()
    sample = random_sample(set(full), cands, cfg.model.n_layers, 0)
    named = [baseline(n, cfg.model, 256).describe() for n in named_specs(cands)]
    return {g: full[g] for g in [*sample, *named] if g in full}, sample


def search_dir(cfg, out: Path, variant: str, seed: int) -> Path:
    """The variant's search folder, run or resumed when not finished (module docstring)."""
    from autoln.oneshot.run_search import run_search

    reuse = out / "shallow" / "race7" / f"search-seed{seed}"
    if variant == "softmax" and (reuse / "genotype.json").exists():
        return reuse
    folder = out / "shallow" / "fidelity7" / f"{variant}-seed{seed}"
    if not (folder / "genotype.json").exists():
        resume = (folder / "checkpoint.pt").exists()
        run_search(cfg, folder, overwrite=not resume, resume=resume)
    return folder


def first_site(folder: Path) -> dict:
    """``{"rms", "share"}`` by candidate at the first site of the trained supernet in ``folder``
    (:func:`autoln.models.site.candidate_scales` on 16 validation windows of ``model.context`` tokens;
    RMS in the residual stream's units, shares summing to 1).

    Raises:
        as :func:`ground_truth.trained_supernet`."""
    import torch

    from autoln.data import eval_starts
    from autoln.models.site import candidate_scales

    net, cfg, corpus = trained_supernet(folder)
    valid, t = corpus.splits["valid"], cfg.model.context
    x = torch.stack([torch.from_numpy(valid[s:s + t].astype("int64")) for s in eval_starts(len(valid), t, 16)])
    scales = candidate_scales(net, x, lambda x: net(x))
    return scales[sorted(scales)[0]]


def measure(variant: str, seed: int, args) -> dict:
    """One row (module docstring): the variant's search (run, resumed or reused), its one-hot
    scores in bits per byte against the table's seed-0 valid bits per byte, and its read-off
    retrained at seed 0 (a table row; run when missing). ``split``: one search per kind of
    residual stream (``autoln.space.placements.stream_groups``, in ``split-<kind>-seed<s>``), each
    scoring the table genotypes inside its group; the one whose read-off scores lower answers
    (``own_model_fidelity.split_row``'s figures).

    Raises:
        KeyError: an unknown variant; ConfigError: a bad override; TableError: the table holds
        fewer than two genotypes of the seven-candidate ``shallow`` space."""
    from autoln.space.placements import stream_groups

    common = [SEVEN, *base_overrides(args), f"search.seed={seed}", "race.enabled=false"]
    s = setting_config("shallow", common, args.config).search
    extra = [] if variant == "split" else variant_overrides(variant, s.steps, s.warmup_steps, s.arch_warmup_steps)
    cfg = setting_config("shallow", [*common, *extra], args.config)
    values, sample = truth(read_table(args.table), cfg, "+".join(cfg.model.searched_candidates()))
    if variant != "split":
        folder, search_s, scores = searched(cfg, args, variant, seed, list(values))
        return row_of(variant, seed, args, cfg, folder, scores, values, sample, search_s)
    scores, best, search_s = {}, None, 0.0
    for kind, group in stream_groups(cfg.model.searched_candidates()).items():
        sub = setting_config("shallow", [*common, f"model.candidates=[{', '.join(group)}]"], args.config)
        inside = [g for g in values if set(g.split()) <= set(group)]
        folder, secs, own = searched(sub, args, f"split-{kind}", seed, inside, read_off=True)
        search_s += secs
        read_off = own.pop("read-off")
        scores.update(own)
        if best is None or read_off < best[0]:
            best = (read_off, folder)
    return row_of(variant, seed, args, cfg, best[1], scores, values, sample, search_s)


def searched(cfg, args, variant: str, seed: int, genotypes: list[str], read_off: bool = False):
    """The variant's search folder (:func:`search_dir`), its wall time (s) and its one-hot
    scores (bits per byte) of ``genotypes`` and, with ``read_off``, of its own answer (key
    ``"read-off"``)."""
    from autoln.models.genotype import Genotype

    t0 = time.perf_counter()
    folder = search_dir(cfg, Path(args.out), variant, seed)
    search_s = time.perf_counter() - t0
    answer = [Genotype.load(folder / "genotype.json").describe()] if read_off else []
    keys = [*genotypes, *(["read-off"] if read_off else [])]
    bits = (v / math.log(2) for v in supernet_scores(folder, [g.split() for g in [*genotypes, *answer]], args.windows))
    return folder, search_s, dict(zip(keys, bits))


def row_of(variant: str, seed: int, args, cfg, folder: Path, scores: dict, values: dict, sample: list[str], search_s: float) -> dict:
    """The row of ``variant``: the read-off of the search in ``folder`` retrained at seed 0
    under ``cfg`` (the seven-candidate setting; a table row, run when missing) and the figures of
    ``own_model_fidelity.fidelity_row`` (``split_row`` for ``split``)."""
    from autoln.data import load_corpus
    from autoln.models.genotype import Genotype
    from autoln.race.rule import Job
    from autoln.race.run_race import job_config

    placements = Genotype.load(folder / "genotype.json").describe()
    runs = Path(args.out) / "shallow" / "fidelity7" / "retrains"
    retrains = TableRetrains("shallow", "+".join(cfg.model.searched_candidates()), args.table, runs,
                             load_corpus(cfg.data).fingerprint)
    read_off_val = retrains.value(job_config(cfg, Job(placements, cfg.retrain.steps, 0)), placements,
                                  str(folder / "genotype.json"), placements, runs / placements.replace(" ", "_"))
    figures = (scores, values, placements, read_off_val, [values[g] for g in sample], first_site(folder), search_s, retrains.commit)
    if variant == "split":
        return split_row(seed, *figures)
    return fidelity_row(variant, seed, *figures)


def noise_ceiling(n: int, args) -> tuple[float | None, int]:
    """Kendall's tau between seeds 0 and 1 over the first ``n`` genotypes of the table's random
    sample (:func:`truth`), each retrained at seed 1 when the table lacks it (a table row; one
    held by another process's lock is left to it and counted when finished). Returns ``(tau,
    genotypes at both seeds)``; tau is None below two.

    Raises:
        ConfigError: a bad override; TableError: a damaged table."""
    from scipy.stats import kendalltau

    from autoln.data import load_corpus
    from autoln.core.errors import FolderInUse
    from autoln.core.locks import FolderLock
    from autoln.race.rule import Job
    from autoln.race.run_race import job_config

    cfg = setting_config("shallow", [SEVEN, *base_overrides(args), "race.enabled=false"], args.config)
    space = "+".join(cfg.model.searched_candidates())
    values, sample = truth(read_table(args.table), cfg, space)
    runs = Path(args.out) / "shallow" / "fidelity7" / "ceiling"
    retrains = TableRetrains("shallow", space, args.table, runs, load_corpus(cfg.data).fingerprint)
    seed1 = job_config(cfg, Job("", cfg.retrain.steps, 1))
    files = dict(zip(sample[:n], write_sample(cfg, runs / "sample", min(n, len(sample)), 0)))
    for g in sample[:n]:
        if retrains.find(seed1, g) is not None:
            continue
        folder = runs / f"{g.replace(' ', '_')}-seed1"
        try:
            with FolderLock(folder, "a ceiling retrain", name="ceiling.lock"):
                retrains.rows = read_table(args.table)
                if retrains.find(seed1, g) is None:
                    retrains.value(seed1, g, files[g], g, folder / "run")
        except FolderInUse:
            continue
    retrains.rows = read_table(args.table)
    both = [g for g in sample[:n] if retrains.find(seed1, g) is not None]
    if len(both) < 2:
        return None, len(both)
    return float(kendalltau([values[g] for g in both], [retrains.find(seed1, g).valid for g in both]).statistic), len(both)


def main(argv=None) -> int:
    p = OneLineParser(prog="shallow_fidelity.py", description=__doc__.split("\n\n")[0])
    add_common_arguments(p, "shallow")
    p.add_argument("--variants", default="softmax,common,spos,fair")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--windows", type=int, default=256, help="validation windows of the one-hot scores")
    p.add_argument("--rows", type=Path, default=OUT, help="the results table (one row per variant and search seed)")
    p.add_argument("--ceiling", type=int, default=20, metavar="N",
                   help="the first N genotypes of the random sample also at seed 1: the table's noise ceiling (default 20; 0: none)")
    args = p.parse_args(argv)
    if args.ceiling < 0:
        p.error(f"--ceiling: expected a count of genotypes, 0 or more, got {args.ceiling}")
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            p.error(f"--variants: unknown variant {v!r} (expected some of {', '.join(VARIANTS)})")
    have = set()
    if args.rows.exists():
        with open(args.rows, newline="", encoding="utf-8") as f:
            have = {(r["variant"], int(r["search_seed"])) for r in csv.DictReader(f)}

    def body() -> None:
        if args.ceiling > 0:
            tau, n = noise_ceiling(args.ceiling, args)
            print("[fidelity] shallow-7 noise ceiling: Kendall tau(seed 0, seed 1) = "
                  + (f"{tau:.3f}" if tau is not None else "-") + f" over {n} genotypes of the random sample", flush=True)
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
