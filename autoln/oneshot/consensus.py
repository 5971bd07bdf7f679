"""``search.py --seeds N``: N searches that differ only in their seed, and their consensus.

A search's answer is only as good as its agreement across seeds (the "reproducibility" check of
NAS-Bench-style evaluations; Yang, Esperança, Carlucci 2020, "NAS evaluation is frustratingly
hard", §4). Seed ``i`` runs in ``<out>/seed<s>`` with ``search.seed = s = search.seed + i``;
a seed whose ``genotype.json`` exists is reused, one with a checkpoint is resumed, so re-running
the command finishes an interrupted set. Outputs in ``<out>``:

- ``genotype.json``: the consensus genotype: per site the majority placement (a tie goes to the
  tied placement with the larger mean probability), the probabilities averaged over the seeds,
  and in ``provenance.consensus`` the votes, the agreement and each seed's genotype;
- ``votes.md``: per site the votes of each candidate, whether the seeds agree, the majority;
- TensorBoard (``<out>`` itself): ``consensus/agreement``, ``votes/<site>/<candidate>`` and the
  vote table as text.

*Agreement* is the fraction of sites at which every seed chose the same placement.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from autoln.config import Config, with_defaults
from autoln.core.errors import ConfigError
from autoln.models.genotype import Genotype, bounded_provenance, nest_sites, qk_field, site_rows
from autoln.core.io import write_text_atomic
from autoln.core.locks import FolderLock
from autoln.models.supernet import site_names
from autoln.engine.training import CHECKPOINT_FILE, check_out_dir, prepare_out_dir, utc_now

GENOTYPE_FILE = "genotype.json"
VOTES_FILE = "votes.md"


@dataclass
class Consensus:
    """Votes of several seeds' genotypes.

    Attributes:
        candidates: candidate names, the columns of ``votes``.
        sites: site names (rows), as :func:`autoln.models.supernet.site_names`.
        votes: ``(n_sites, K)`` int, how many seeds chose each candidate at each site.
        choices: per site the majority candidate's index.
        agreement: fraction of sites at which all seeds agree, in [0, 1].
        probabilities: ``(n_sites, K)`` the seeds' probabilities averaged.
    """

    candidates: list[str]
    sites: list[str]
    votes: np.ndarray
    choices: list[int]
    agreement: float
    probabilities: np.ndarray


def site_choices(genotype: Genotype) -> list[str]:
    """The genotype's placement per site, rows as :func:`autoln.models.supernet.site_names`."""
    return site_rows(genotype.placements, genotype.granularity)


def vote(genotypes: list[Genotype]) -> Consensus:
    """The per-site majority of ``genotypes`` (searched with the same candidates, granularity and
    model); a tie goes to the tied candidate with the larger mean probability, then to the
    earlier candidate.

    Raises:
        ConfigError: no genotypes, or genotypes of different search spaces or sizes.
    """
    if not genotypes:
        raise ConfigError("--seeds: no genotype to vote on")
    first = genotypes[0]
    for g in genotypes[1:]:
        if (g.candidates, g.granularity, g.model) != (first.candidates, first.granularity, first.model):
            raise ConfigError("--seeds: the seeds' genotypes differ in candidates, granularity or model size")
    cands = list(first.candidates)
    chosen = np.array([[cands.index(n) for n in site_choices(g)] for g in genotypes])  # (seeds, sites)
    votes = np.stack([np.bincount(chosen[:, s], minlength=len(cands)) for s in range(chosen.shape[1])])
    probs = np.mean([g.site_probabilities() for g in genotypes], axis=0)
    choices = [int(np.lexsort((-probs[s], -votes[s]))[0]) for s in range(votes.shape[0])]
    agreement = float(np.mean(votes.max(axis=1) == len(genotypes)))
    return Consensus(cands, site_names(first.model["n_layers"], first.granularity), votes, choices, agreement, probs)


def votes_markdown(c: Consensus, seeds: list[int]) -> str:
    """The vote table as Markdown: one row per site."""
    head = (f"Votes of {len(seeds)} searches (seeds {', '.join(map(str, seeds))}); agreement "
            f"{c.agreement:.0%} of sites (all seeds chose the same placement).\n\n"
            "| site | " + " | ".join(c.candidates) + " | agree | majority |\n|---|" + "---|" * (len(c.candidates) + 2) + "\n")
    rows = [f"| {site} | " + " | ".join(str(int(v)) for v in c.votes[i]) + f" | {'yes' if c.votes[i].max() == len(seeds) else 'no'} | "
            f"{majority_cell(c, i)} |" for i, site in enumerate(c.sites)]
    return head + "\n".join(rows) + "\n"


def tied(c: Consensus, site: int) -> list[int]:
    """The candidates sharing the most votes at ``site`` (one index when there is a majority)."""
    return [int(k) for k in np.flatnonzero(c.votes[site] == c.votes[site].max())]


def majority_cell(c: Consensus, site: int) -> str:
    """The vote table's last cell: the majority, or for a tie the placement that broke it and by
    what (the larger mean probability over the seeds)."""
    name = f"**{c.candidates[c.choices[site]]}**"
    ties = tied(c, site)
    if len(ties) == 1:
        return name
    probs = ", ".join(f"{c.candidates[k]} {c.probabilities[site][k]:.3f}" for k in ties)
    return f"{name} (a {'-'.join(str(int(c.votes[site].max())) for _ in ties)} tie, broken by the larger mean probability: {probs})"


def consensus_genotype(c: Consensus, genotypes: list[Genotype], seeds: list[int], folders: list[Path]) -> Genotype:
    """The consensus :class:`Genotype`: majority placements, mean probabilities, and the votes in
    ``provenance.consensus``; the first seed's provenance otherwise (config with its seed), as
    bounded as any copy of a genotype (:func:`autoln.models.genotype.bounded_provenance`)."""
    first = genotypes[0]
    copied = bounded_provenance(first.provenance, str(folders[0] / GENOTYPE_FILE))[0]
    rows = [[float(v) for v in row / row.sum()] for row in c.probabilities]
    provenance = {
        "created": utc_now(), "command": " ".join(sys.argv), "config": copied.get("config"),
        "data": copied.get("data"), "packages": copied.get("packages"),
        "selection": {"method": (first.provenance.get("selection") or {}).get("method")},
        "consensus": {"seeds": seeds, "agreement": c.agreement,
                      "votes": nest_sites([[int(v) for v in row] for row in c.votes], first.granularity),
                      "genotypes": [{"seed": s, "file": str(f / GENOTYPE_FILE), "placements": g.describe()}
                                    for s, g, f in zip(seeds, genotypes, folders)]},
    }
    names = [c.candidates[k] for k in c.choices]
    return Genotype(list(c.candidates), first.granularity, nest_sites(names, first.granularity),
                    nest_sites(rows, first.granularity), dict(first.model), provenance, qk_consensus(genotypes))


def qk_consensus(genotypes: list[Genotype]) -> Optional[dict]:
    """The consensus of the seeds' QK-norm choices (:mod:`autoln.space.qk`): per block the choice of
    most seeds, a tie broken by the larger mean probability; the genotype's ``qk_norm`` field, None
    when no seed chose QK-norm anywhere."""
    with_qk = [g.qk_norm for g in genotypes if g.qk_norm is not None]
    if not with_qk:
        return None
    cands = list(with_qk[0]["candidates"])
    n = len(genotypes[0].placements)
    probs = np.zeros((n, len(cands)))
    votes = np.zeros((n, len(cands)))
    for g in genotypes:
        for i, choice in enumerate(g.qk_choices()):
            votes[i, cands.index(choice) if choice in cands else 0] += 1
        if g.qk_norm is not None and list(g.qk_norm["candidates"]) == cands:
            probs += np.asarray(g.qk_norm["probabilities"], dtype=np.float64)
        else:  # a seed without QK-norm anywhere: one-hot on none
            probs[:, cands.index("none") if "none" in cands else 0] += 1
    choices = [cands[max(range(len(cands)), key=lambda k: (votes[i, k], probs[i, k]))] for i in range(n)]
    return qk_field(cands, choices, probs / len(genotypes))


#: Config sections that decide what a search computes (logging and the tuner's settings do not).
SEARCH_SECTIONS = ("data", "model", "search")


def check_same_search(folder: Path, cfg: Config) -> None:
    """Refuse to reuse the finished search in ``folder`` unless its genotype's recorded config
    equals ``cfg`` in :data:`SEARCH_SECTIONS` (device and progress aside; ``data.corpus`` aside
    when the corpus there now has the bytes the search recorded: it moved).

    Raises:
        ConfigError: naming each differing key, and the way out (``--overwrite`` or another ``--out``).
    """
    from autoln.engine.folders import differences

    def relevant(d: dict) -> dict:
        out = {k: dict(v) for k, v in d.items() if k in SEARCH_SECTIONS}
        out.get("search", {}).pop("device", None)
        return out

    provenance = Genotype.load(folder / GENOTYPE_FILE).provenance
    recorded = provenance.get("config") or {}
    diff = differences(relevant(with_defaults(recorded)), relevant(cfg.to_dict()))
    if any(d.startswith("data.corpus ") for d in diff):  # a corpus that moved with its bytes is the same
        from autoln.data import load_corpus

        if (provenance.get("data") or {}).get("fingerprint_sha256") == load_corpus(cfg.data).fingerprint:
            diff = [d for d in diff if not d.startswith("data.corpus ")]
    if diff:
        raise ConfigError(f"{folder} holds a search made with other settings ({'; '.join(diff)}); "
                          "choose another --out or pass --overwrite to redo every seed")


def clear_folder(out: Path) -> None:
    """With ``--overwrite``: remove a previous run from ``out`` (a run's files and event files, as
    :func:`autoln.engine.training.prepare_out_dir`, plus ``votes.md`` and every ``seed<s>`` folder), so
    the folder never mixes two runs."""
    import re
    import shutil

    prepare_out_dir(out, overwrite=True)
    (out / VOTES_FILE).unlink(missing_ok=True)
    for folder in out.glob("seed*"):
        if folder.is_dir() and re.fullmatch(r"seed\d+", folder.name):
            shutil.rmtree(folder)


def _search_one(cfg: Config, out: str, resume: bool, threads: Optional[int]) -> str:
    """Worker: one search (in a fresh process with ``--workers``); returns its genotype path."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    from autoln.oneshot.run_search import run_search

    return str(run_search(cfg, out, overwrite=not resume, resume=resume).path)


def run_seeds(cfg: Config, n_seeds: int, out: str | Path, workers: int = 1, overwrite: bool = False) -> tuple[Consensus, Path]:
    """Run ``n_seeds`` searches (seeds ``cfg.search.seed ..+n_seeds-1``) under ``out`` and write
    the consensus (module docstring). ``workers > 1`` runs that many searches at once, each in
    its own process with an equal share of the CPU threads (:mod:`autoln.engine.workers`) and no progress bar.

    Returns ``(consensus, path of the consensus genotype.json)``.

    Raises:
        ConfigError: ``n_seeds < 2`` or ``workers < 1``.
        OutputError: ``out`` holds another command's run, or a finished consensus without
            ``overwrite`` (which removes the previous consensus and its seed folders first).
        ConfigError: a finished seed in ``out`` was searched with other settings.
        DataError, DivergenceError: from a seed's search (finished seeds are kept).
        OutputError: another process holds ``out`` (:class:`autoln.core.locks.FolderLock`).
    """
    if n_seeds < 2:
        raise ConfigError(f"--seeds must be at least 2 (one search needs no consensus), got {n_seeds}")
    if workers < 1:
        raise ConfigError(f"--workers must be a positive integer, got {workers}")
    out = Path(out)
    with FolderLock(out, "search --seeds"):  # the seeds' folder is this process's until it ends
        return _run_seeds(cfg, n_seeds, out, workers, overwrite)


def _run_seeds(cfg: Config, n_seeds: int, out: Path, workers: int, overwrite: bool) -> tuple[Consensus, Path]:
    """The body of :func:`run_seeds`, under its folder's lock."""
    from autoln.core.tb import Logger

    out = check_out_dir(out, overwrite)  # refuses another run's folder, and a finished consensus without --overwrite
    seeds = [cfg.search.seed + i for i in range(n_seeds)]
    folders = [out / f"seed{s}" for s in seeds]
    jobs = []
    for s, folder in zip(seeds, folders):
        seeded = dataclasses.replace(cfg, search=dataclasses.replace(cfg.search, seed=s))
        if (folder / GENOTYPE_FILE).exists() and not overwrite:
            check_same_search(folder, seeded)
            print(f"[seeds] seed {s}: reusing {folder / GENOTYPE_FILE}", file=sys.stderr)
            continue
        resume = (folder / CHECKPOINT_FILE).exists() and not overwrite
        jobs.append((s, seeded, folder, resume))
    if overwrite:
        clear_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    if workers == 1 or len(jobs) <= 1:
        for s, seeded, folder, resume in jobs:
            print(f"[seeds] seed {s} -> {folder}" + (" (resuming)" if resume else ""), file=sys.stderr, flush=True)
            _search_one(seeded, str(folder), resume, None)
    else:
        from autoln.engine.workers import run_in_processes

        calls = []
        for s, seeded, folder, resume in jobs:
            quiet = dataclasses.replace(seeded, logging=dataclasses.replace(seeded.logging, progress=False))
            print(f"[seeds] seed {s} -> {folder} (worker process)", file=sys.stderr, flush=True)
            calls.append((quiet, str(folder), resume))
        run_in_processes(_search_one, calls, workers,
                         done=lambda i, _: print(f"[seeds] seed {jobs[i][0]} done", file=sys.stderr, flush=True))
    genotypes = [Genotype.load(f / GENOTYPE_FILE) for f in folders]
    consensus = vote(genotypes)
    genotype = consensus_genotype(consensus, genotypes, seeds, folders)
    table = votes_markdown(consensus, seeds)
    write_text_atomic(out / VOTES_FILE, table)
    path = genotype.save(out / GENOTYPE_FILE)
    if cfg.logging.tensorboard:
        log = Logger(out)
        log.scalar("consensus/agreement", consensus.agreement, 0)
        for site, row in zip(consensus.sites, consensus.votes):
            log.scalars({cand: int(v) for cand, v in zip(consensus.candidates, row)}, 0, f"votes/{site}")
        log.text("votes", table)
        log.text("genotype", f"consensus: `{genotype.describe()}`")
        log.close()
    return consensus, path
