"""The search judged against the space it searches (docs/design.md §7): sampling the space,
scoring genotypes with a trained supernet, and Kendall's tau between two rankings.

- :func:`sample_genotypes`: a uniform random sample of *distinct* genotypes of a
  ``granularity: layer`` space (every block one of ``K`` candidates, ``K^N`` in all), the
  random architectures the field judges a search against (Li & Talwalkar 2019, "Random Search
  and Reproducibility for Neural Architecture Search"; Yu et al. 2020, "Evaluating the Search
  Phase of Neural Architecture Search").
- :func:`one_hot_mixing` and :func:`score_genotypes`: the trained supernet's loss with a
  genotype imposed one-hot (every site's mixing weight 1 on the genotype's candidate), forward
  passes only on fixed windows; the supernet's own estimate of each genotype, as SPOS scores
  candidate paths with its weights (Guo et al. 2020).
- :func:`kendall_tau`: Kendall's tau-b between the supernet's scores and the retrained losses
  (the supernet-fidelity measure of Yu et al. 2020 and NAS-Bench-201, Dong & Yang 2020), by
  ``scipy.stats.kendalltau``.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
import torch


Placements = Sequence[tuple[str, str]]


def sample_genotypes(n: int, n_layers: int, candidates: Sequence[str], seed: int,
                     exclude: Sequence[Sequence[str]] = ()) -> list[list[str]]:
    """``n`` distinct genotypes drawn uniformly from the ``K^N`` per-block genotypes (``K =
    len(candidates)``, ``N = n_layers``), each a list of ``N`` candidate names, in the order
    drawn. Reproducible: the same arguments give the same list, and a larger ``n`` extends a
    smaller one's list (draws are rejected only when already taken).

    Args:
        n: how many; at most ``K^N - len(exclude)``.
        n_layers: ``N``.
        candidates: the candidate names of one site, e.g. ``["pre", "post", "deepnorm"]``.
        seed: seed of the ``numpy`` generator.
        exclude: genotypes not to draw (each a list of ``N`` names), e.g. ones already trained.

    Raises:
        ValueError: ``n`` negative or larger than the space less ``exclude``; fewer than two
            candidates; an ``exclude`` entry of the wrong length.
    """
    k = len(candidates)
    if k < 2 or n_layers < 1:
        raise ValueError(f"sample_genotypes: need at least two candidates and one block, got {list(candidates)} and {n_layers}")
    taken = {tuple(g) for g in exclude}
    if any(len(g) != n_layers for g in taken):
        raise ValueError(f"sample_genotypes: every excluded genotype needs {n_layers} placements")
    room = k ** n_layers - len(taken)
    if not 0 <= n <= room:
        raise ValueError(f"sample_genotypes: asked for {n} distinct genotypes; the space of {k}^{n_layers} holds {room} more")
    rng = np.random.default_rng(seed)
    out: list[list[str]] = []
    while len(out) < n:
        g = tuple(candidates[i] for i in rng.integers(0, k, n_layers))
        if g not in taken:
            taken.add(g)
            out.append(list(g))
    return out


def one_hot_mixing(supernet, placements: Placements) -> torch.Tensor:
    """The mixing weights ``(n_layers, 2, K)`` that impose ``placements`` (per block ``(attention
    placement, FFN placement)``) on ``supernet``: 1 at each sublayer's candidate, 0 elsewhere.
    With these weights the supernet computes exactly its derived model with the same weights
    (docs/design.md §3).

    Raises:
        ValueError: wrong number of blocks; a placement not among ``supernet.candidates``; a
            block whose two sublayers differ in a ``granularity: layer`` supernet (one alpha row
            per block cannot express it).
    """
    cands = list(supernet.candidates)
    n = supernet.cfg.n_layers
    if len(placements) != n:
        raise ValueError(f"one_hot_mixing: {len(placements)} blocks given for a supernet of {n}")
    mix = torch.zeros(n, 2, len(cands), device=supernet.alphas.device, dtype=supernet.alphas.dtype)
    for i, pair in enumerate(placements):
        if supernet.granularity == "layer" and pair[0] != pair[1]:
            raise ValueError(f"one_hot_mixing: block {i} has {pair[0]}/{pair[1]}, but the supernet has one alpha row per block")
        for j, name in enumerate(pair):
            if name not in cands:
                raise ValueError(f"one_hot_mixing: block {i} placement {name!r} is not a candidate of the supernet {cands}")
            mix[i, j, cands.index(name)] = 1.0
    return mix


@torch.no_grad()
def score_genotypes(supernet, genotypes: Sequence[Placements], tokens: np.ndarray, starts: np.ndarray,
                    batch_size: int, device: Optional[torch.device] = None) -> np.ndarray:
    """The supernet's mean cross-entropy (nats per token) with each genotype imposed one-hot
    (:func:`one_hot_mixing`), on the windows of ``tokens`` at ``starts`` (each
    ``supernet.cfg.context`` tokens long, the same windows for every genotype); eval mode,
    forward passes only. Returns float64 ``(len(genotypes),)``.

    Raises:
        ValueError: as :func:`one_hot_mixing`; no windows.
    """
    from autoln.engine.training import evaluate

    if len(starts) == 0:
        raise ValueError("score_genotypes: no windows to score on")
    device = device or supernet.alphas.device
    return np.array([evaluate(supernet, tokens, np.asarray(starts), supernet.cfg.context, batch_size, device,
                              mix=one_hot_mixing(supernet, placements)) for placements in genotypes], dtype=np.float64)


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b between two paired samples (``scipy.stats.kendalltau``): +1 when they
    rank the items alike, -1 when in reverse, 0 when unrelated; ties are counted as tau-b does.

    Raises:
        ValueError: lengths differ, fewer than two pairs, a value not finite, or a sample that
            is constant (tau is undefined).
    """
    from scipy.stats import kendalltau

    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"kendall_tau: expected two 1-d samples of one length, got shapes {a.shape} and {b.shape}")
    if len(a) < 2:
        raise ValueError("kendall_tau: needs at least two pairs")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise ValueError("kendall_tau: every value must be finite")
    tau = float(kendalltau(a, b).statistic)
    if math.isnan(tau):
        raise ValueError("kendall_tau: a sample is constant, so tau is undefined")
    return tau
