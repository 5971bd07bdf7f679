"""Does the way a genotype is read off the supernet change the agreement across seeds?

Takes the folder of a finished ``search.py --seeds N`` and, for each seed, re-runs only the
perturbation-based selection (DARTS-PT, :mod:`autoln.oneshot.selection`) from that seed's checkpoint of
its last step, with each variant below; the trained supernet is the same for every variant.
It prints per variant the genotypes and the agreement (the fraction of sites at which every
seed chose the same placement, as ``search.py --seeds``).

Variants:

- ``random``: the default (sites in a random order drawn from ``search.seed``); reproduces
  the seeds' own genotypes and loss rises exactly when run with the seed's number of torch
  threads (``search.py --seeds --workers W`` gives each seed ``cpu_count // W``; float sums in
  another order move the loss rises in the 6th decimal).
- ``random-256``: the same with 256 selection windows instead of ``search.selection_windows``.
- ``greedy``: SGAS's greedy order (Li et al. 2020, "SGAS: Sequential Greedy Architecture
  Search"): before each decision, measure every undecided site and decide the one whose top
  loss rise leads its runner-up most.
- ``first-pass``: the sites ordered once by that lead, measured before any decision.
- ``bottom-up`` / ``top-down``: the sites in the model's order (block0 first) or its reverse,
  the same for every seed (removes the order's randomness; the lower blocks feed the upper ones).
- ``one-shot``: every site's rises measured on the final supernet, no fine-tuning between
  decisions (128 windows).
- ``score``: ``search.selection=score`` (SPOS): the genotype whose one-hot supernet loss on the
  selection windows is lowest, every genotype up to 4096, else evolution; no fine-tuning.
- ``argmax``: ``search.selection=argmax`` (DARTS): the largest alpha per site.

``--seeds-dir`` may also be a single search's folder (e.g. ``experiments/common/validate.py``'s
``<out>/<setting>/search``), which is then the only "seed".

Each run writes ``<out>/<variant>/seed<s>`` (a copy of the seed's checkpoint and config, then
the resumed selection's ``genotype.json``); a finished run is reused.

    python experiments/fidelity/selection_variants.py --seeds-dir runs/seeds-<stamp> [--variants random,greedy] [--out runs/selection]

About 2 minutes per seed and variant on 2 CPU cores at the default size.
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path
from unittest import mock

import numpy as np

import autoln.oneshot.run_search as rs
from autoln.engine.checkpoint import CHECKPOINT_FILE
from autoln.cli import guarded
from autoln.config import load_config
from autoln.core.io import copy_atomic, read_json, write_json_atomic
from autoln.oneshot.consensus import vote
from autoln.models.genotype import Genotype
from autoln.oneshot.selection import Selection, loss_rises

VARIANTS = ("random", "random-256", "greedy", "first-pass", "bottom-up", "top-down", "one-shot", "score", "argmax")
#: Variants that are another ``search.selection`` rather than another perturbation order.
SELECTION_OF = {"score": "score", "argmax": "argmax"}
WINDOWS = {"random-256": 256, "one-shot": 128}


def lead(rises: np.ndarray) -> float:
    """The top loss rise's lead over the runner-up (nats/token) of one site's ``(K,)`` rises."""
    top2 = np.sort(rises)[-2:]
    return float(top2[1] - top2[0])


def selector(variant: str):
    """A drop-in for :func:`autoln.oneshot.selection.perturbation_select` that decides in ``variant``'s way."""
    def select(model, loss, tune, order) -> Selection:
        n, k = model.alphas.shape[0], len(model.candidates)
        model.projected = {}
        rises, base, done = np.zeros((n, k)), [0.0] * n, []
        if variant == "one-shot":
            for site in range(n):
                base[site], rises[site] = loss_rises(model, site, loss)
            model.projected = {site: int(np.argmax(rises[site])) for site in range(n)}
            return Selection([model.projected[s] for s in range(n)], rises, base, list(range(n)))
        fixed = list(order) if variant.startswith("random") else None
        if variant == "first-pass":
            first = {site: lead(loss_rises(model, site, loss)[1]) for site in range(n)}
            fixed = sorted(range(n), key=lambda site: -first[site])
        if variant in ("bottom-up", "top-down"):
            fixed = list(range(n)) if variant == "bottom-up" else list(range(n))[::-1]
        for i in range(n):
            if fixed is None:  # greedy: the most decided site next
                measured = {s: loss_rises(model, s, loss) for s in range(n) if s not in model.projected}
                site = max(measured, key=lambda s: lead(measured[s][1]))
                base[site], rises[site] = measured[site]
            else:
                site = fixed[i]
                base[site], rises[site] = loss_rises(model, site, loss)
            model.projected[site] = int(np.argmax(rises[site]))
            done.append(site)
            if i < n - 1:
                tune()
        return Selection([model.projected[s] for s in range(n)], rises, base, done)
    return select


def source_stamp(seed_dir: Path) -> str:
    """What identifies the search in ``seed_dir``: the SHA-256 of its ``genotype.json`` (written
    once per search, with its time and config), else of its checkpoint."""
    import hashlib

    path = seed_dir / rs.GENOTYPE_FILE if (seed_dir / rs.GENOTYPE_FILE).exists() else seed_dir / CHECKPOINT_FILE
    return hashlib.sha256(path.read_bytes()).hexdigest()


def reselect(seed_dir: Path, out: Path, variant: str) -> Genotype:
    """Re-run the selection of the search in ``seed_dir`` into ``out`` with ``variant``. A
    finished one in ``out`` is reused only when it was read off this very search
    (``source.json``: :func:`source_stamp`); one read off an earlier search there is redone."""
    import shutil

    stamp = source_stamp(seed_dir)
    if (out / rs.GENOTYPE_FILE).exists():
        recorded = read_json(out / "source.json")
        if isinstance(recorded, dict) and recorded.get("sha256") == stamp:
            return Genotype.load(out / rs.GENOTYPE_FILE)
        print(f"[selection] {out} was read off another search than {seed_dir}'s; reading it off again", file=sys.stderr)
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "source.json", {"search": str(seed_dir), "sha256": stamp})
    for name in (CHECKPOINT_FILE, "config.yaml"):
        copy_atomic(seed_dir / name, out / name)
    saved = load_config(out / "config.yaml", ["logging.progress=false"])
    cfg = copy.deepcopy(saved)
    cfg.search.selection_windows = WINDOWS.get(variant, saved.search.selection_windows)
    cfg.search.selection = SELECTION_OF.get(variant, "perturbation")
    plain_load = rs.load_for_resume

    def load(folder, kind, _cfg, finished):  # the checkpoint's own config: the windows are not checked
        return plain_load(folder, kind, saved, finished)

    with mock.patch.object(rs, "perturbation_select", selector(variant)), mock.patch.object(rs, "load_for_resume", load):
        return rs.run_search(cfg, out, resume=True).genotype


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds-dir", required=True, type=Path, help="the --out folder of a finished search.py --seeds N")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--out", type=Path, default=Path("runs/selection"))
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        p.error(f"--variants: unknown {unknown}; expected some of {', '.join(VARIANTS)}")
    seeds = sorted(args.seeds_dir.glob("seed*/" + CHECKPOINT_FILE))
    if not seeds and (args.seeds_dir / CHECKPOINT_FILE).exists():  # one search's folder
        seeds = [args.seeds_dir / CHECKPOINT_FILE]
    if not seeds:
        p.error(f"--seeds-dir {args.seeds_dir}: no seed*/{CHECKPOINT_FILE} (the folder of a finished search.py --seeds N)")

    def body() -> None:
        rows = []
        for variant in variants:
            genotypes = [reselect(ck.parent, args.out / variant / (ck.parent.name if len(seeds) > 1 else "search"), variant)
                         for ck in seeds]
            c = vote(genotypes)
            rows.append(f"| {variant} | " + " / ".join(g.describe() for g in genotypes) + f" | {c.agreement:.0%} |")
        print("| variant | genotypes (" + ", ".join(ck.parent.name for ck in seeds) + ") | agreement |\n|---|---|---|")
        print("\n".join(rows))

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
