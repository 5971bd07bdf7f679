"""Turning a trained supernet into a genotype (``search.selection``).

- ``argmax``: per site the candidate of largest alpha (DARTS, Liu et al. 2019, §2.4).
- ``perturbation``: perturbation-based selection (DARTS-PT; Wang, Cheng, Chen, Tang, Hsieh
  2021, "Rethinking Architecture Selection in Differentiable NAS", Alg. 1; reference code
  ruocwang/darts-pt, ``project_op`` with ``proj_crit: loss``). Alpha magnitude need not
  reflect how much a candidate contributes to the supernet, so each site is decided by what
  removing a candidate costs:

  1. take the sites one at a time, in a random order (the reference's ``edge_decision:
     random``; seeded by ``search.seed``);
  2. for each candidate ``k`` of the site, evaluate the supernet with ``k``'s mixing weight
     set to 0 (not renormalised, as the reference masks an operation) on fixed D_alpha
     windows; its *loss rise* is that loss minus the unperturbed supernet's;
  3. keep the candidate whose removal raises the loss most: the site becomes one-hot
     (:attr:`autoln.models.supernet.Supernet.projected`);
  4. fine-tune the supernet (bilevel steps, as the reference's ``proj_intv`` epochs of
     ``architect.step`` + weight step) before the next site.

- ``score``: the supernet scores whole genotypes (SPOS, Guo et al. 2020, "Single Path One-Shot
  NAS with Uniform Sampling", §3.3): each candidate genotype is imposed one-hot on the trained
  supernet and its loss measured on the same fixed D_alpha windows; the lowest wins. Every
  genotype when the space holds at most ``max_exhaustive`` (``3^6 = 729`` at the default), else
  SPOS's evolutionary search (population 50, 20 generations, top 10 kept, half mutation with
  probability 0.1 per site, half crossover: the reference megvii-model/SinglePathOneShot).

Loss rises and scores are in nats per token; a positive rise means the candidate helps the supernet.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from autoln.config import SELECTIONS  # noqa: F401  (the names of search.selection)
from autoln.models.supernet import Supernet

#: ``loss(mix)``: mean cross-entropy (nats/token) of the supernet on the fixed selection windows
#: with mixing weights ``mix`` ``(n_layers, 2, K)``.
LossFn = Callable[[torch.Tensor], float]
#: ``tune()``: the fine-tuning between two decisions (a few bilevel steps).
TuneFn = Callable[[], None]


@dataclass
class Selection:
    """The outcome of :func:`perturbation_select`.

    Attributes:
        choices: per site (rows of :func:`autoln.models.supernet.site_names`) the chosen candidate's index.
        loss_rises: ``(n_sites, K)`` loss rise in nats/token when each candidate is removed,
            measured when its site was decided.
        base_losses: per site, the supernet's loss (nats/token) just before its decision.
        order: the sites in the order they were decided.
    """

    choices: list[int]
    loss_rises: np.ndarray
    base_losses: list[float]
    order: list[int]


def loss_rises(model: Supernet, site: int, loss: LossFn) -> tuple[float, np.ndarray]:
    """``(base loss, rises (K,))`` at ``site``: the supernet's loss with its current (partly
    projected) mixing weights, and for each candidate ``k`` the loss with ``k`` removed minus
    that base (DARTS-PT's criterion, in nats/token)."""
    with torch.no_grad():
        base = loss(model.mixing_weights())
        rises = np.array([loss(model.mixing_weights(drop=(site, k))) - base for k in range(len(model.candidates))])
    return base, rises


def perturbation_select(model: Supernet, loss: LossFn, tune: TuneFn, order: Sequence[int]) -> Selection:
    """Decide every site of ``model`` by perturbation (module docstring), in ``order``.

    The model is left with every site projected (one-hot) and fine-tuned between decisions;
    ``tune`` is called after each decision but the last. Ties go to the first candidate; NaN
    rises (a diverged supernet) are passed over, and a site with no finite rise takes the
    argmax of its alphas.

    Raises:
        ValueError: ``order`` is not a permutation of the sites.
    """
    n_sites = model.alphas.shape[0]
    if sorted(order) != list(range(n_sites)):
        raise ValueError(f"order must be a permutation of the {n_sites} sites, got {list(order)}")
    model.projected = {}
    rises = np.zeros((n_sites, len(model.candidates)))
    base_losses = [0.0] * n_sites
    for i, site in enumerate(order):
        base_losses[site], rises[site] = loss_rises(model, site, loss)
        finite = np.isfinite(rises[site])
        # a diverged supernet (on_divergence: skip_batch) may give NaN losses: decide among the
        # finite rises, or by the alphas when there is none
        model.projected[site] = int(np.argmax(np.where(finite, rises[site], -np.inf))) if finite.any() \
            else int(model.alphas[site].argmax())
        if i < n_sites - 1:
            tune()
    return Selection([model.projected[s] for s in range(n_sites)], rises, base_losses, list(order))


@dataclass
class ScoreSelection:
    """The outcome of :func:`score_select`.

    Attributes:
        choices: per site the chosen candidate's index (the genotype of lowest loss).
        loss: the supernet's loss (nats/token) with ``choices`` imposed one-hot.
        evaluated: how many distinct genotypes were scored.
        method: ``exhaustive`` or ``evolution``.
        top: the best genotypes scored, ``(choices, loss)``, best first (at most 10).
    """

    choices: list[int]
    loss: float
    evaluated: int
    method: str
    top: list[tuple[list[int], float]]


def most_scored(k: int, n_sites: int, max_exhaustive: int = 4096, population: int = 50, generations: int = 20) -> int:
    """How many genotypes :func:`score_select` scores at most with these settings: every one of
    the ``k^n_sites`` when they are at most ``max_exhaustive``, else ``population`` per
    generation (e.g. ``(3, 12) -> 1000``; the evolution may score fewer, a child seen before is
    not scored again)."""
    space = k ** n_sites
    return space if space <= max_exhaustive else min(space, population * generations)


def score_select(model: Supernet, loss: LossFn, seed: int, max_exhaustive: int = 4096, population: int = 50,
                 generations: int = 20, keep: int = 10, mutation: float = 0.1,
                 progress: Callable[[int], None] | None = None) -> ScoreSelection:
    """Read the genotype off ``model`` by scoring whole genotypes (module docstring, ``score``):
    exhaustively when ``K^n_sites <= max_exhaustive``, else by SPOS's evolutionary search
    (``population`` per generation, ``generations``, the best ``keep`` as parents, per-site
    ``mutation`` probability; seeded by ``seed``). ``loss(mix)`` as for perturbation;
    ``progress(n)`` is called after each scored genotype. The model is left with the chosen
    genotype projected (one-hot, :attr:`autoln.models.supernet.Supernet.projected`); no weight changes.
    Non-finite losses rank last.

    Raises:
        ValueError: ``population`` < 2, ``keep`` < 1 or ``generations`` < 1.
    """
    if population < 2 or keep < 1 or generations < 1:
        raise ValueError(f"score_select: needs population >= 2, keep >= 1, generations >= 1; got {population}, {keep}, {generations}")
    n_sites, k = model.alphas.shape[0], len(model.candidates)
    seen: dict[tuple[int, ...], float] = {}

    def score(g: tuple[int, ...]) -> float:
        if g not in seen:
            model.projected = dict(enumerate(g))
            with torch.no_grad():
                value = float(loss(model.mixing_weights()))
            seen[g] = value if np.isfinite(value) else float("inf")
            if progress is not None:
                progress(len(seen))
        return seen[g]

    if k ** n_sites <= max_exhaustive:
        method = "exhaustive"
        for g in itertools.product(range(k), repeat=n_sites):
            score(g)
    else:
        method = "evolution"
        rng = np.random.default_rng([seed, 7])
        space = k ** n_sites
        pool: list[tuple[int, ...]] = []
        while len(pool) < min(population, space):
            g = tuple(int(v) for v in rng.integers(0, k, n_sites))
            if g not in pool:
                pool.append(g)
        for generation in range(generations):
            for g in pool:
                score(g)
            if generation == generations - 1:
                break
            parents = sorted(seen, key=seen.get)[:keep]
            children: list[tuple[int, ...]] = []
            for make, size in (("mutation", population // 2), ("crossover", population)):
                tries = 0
                while len(children) < size and tries < 10 * population:
                    tries += 1
                    if make == "mutation":
                        p = parents[int(rng.integers(len(parents)))]
                        g = tuple(int(rng.integers(k)) if rng.random() < mutation else v for v in p)
                    else:
                        a, b = (parents[int(i)] for i in rng.integers(len(parents), size=2))
                        g = tuple(x if rng.random() < 0.5 else y for x, y in zip(a, b))
                    if g not in seen and g not in children:
                        children.append(g)
            pool = children
            if not pool:
                break
    ranked = sorted(seen, key=seen.get)
    best = ranked[0]
    model.projected = dict(enumerate(best))
    return ScoreSelection(list(best), seen[best], len(seen), method, [(list(g), seen[g]) for g in ranked[:10]])


def clear_winner(row: np.ndarray, lead: float = 0.15) -> bool:
    """True when the top probability of ``row`` ``(K,)`` leads the runner-up by at least
    ``lead`` (the rule a decisive search is held to; a lead, not an absolute level, because
    with K candidates an absolute level says nothing about the runner-up)."""
    top2 = np.sort(np.asarray(row, dtype=np.float64))[-2:]
    return bool(len(row) < 2 or top2[1] - top2[0] >= lead)


#: Loss rises (nats/token) closer than this to the largest at a site are a tie: the fixed
#: selection batches do not tell them apart, and perturbation-based selection takes the largest.
TIE_RISE = 1e-3


def site_notes(sites: Sequence[str], candidates: Sequence[str], chosen: Sequence[str], probs: np.ndarray,
               rises: Optional[Sequence[Sequence[Optional[float]]]] = None, scored: bool = False,
               scale: float = 1.0, unit: str = "nats/token") -> list[tuple[str, str]]:
    """The notes on a read-off's weak answers, as ``(kind, line)``, the same for ``search.py``
    and ``autoln.search``:

    - ``idle``: sites where removing any candidate does not raise the loss (every rise <= 0):
      the choice is arbitrary;
    - ``tie``: sites where another candidate's rise is within :data:`TIE_RISE` of the chosen
      one's: a tie on the selection batches, broken by the largest rise;
    - ``overruled``: sites whose choice is not the largest probability (the loss rises, or with
      ``scored`` the genotype scores, decided);
    - ``undecided``: no clear winner (:func:`clear_winner`: the top probability leads the
      runner-up by less than 0.15).

    Args: ``sites`` names; ``candidates`` ``(K,)``; ``chosen`` the placement per site; ``probs``
    ``(n_sites, K)``; ``rises`` per site ``K`` loss rises (nats/token, None for NaN) or None;
    the lines give rises times ``scale`` in ``unit`` (:func:`autoln.cli.search_command.loss_unit`: the valid line's).
    """
    notes: list[tuple[str, str]] = []
    if rises is not None:
        idle, tied = [], []
        for site, name, row in zip(sites, chosen, rises):
            vals = {c: float(v) for c, v in zip(candidates, row) if v is not None and math.isfinite(float(v))}
            if all(v <= 0 for v in vals.values()):
                idle.append(site)
                continue
            top = vals.get(name, max(vals.values()))
            close = [f"{c} {v * scale:+.4g}" for c, v in vals.items() if c != name and top - v < TIE_RISE]
            if close:
                tied.append(f"{site} ({name} {top * scale:+.4g} against {', '.join(close)})")
        if idle:
            notes.append(("idle", f"at {', '.join(idle)} removing any candidate does not raise the loss: the choice there is arbitrary"))
        if tied:
            notes.append(("tie", f"loss rises within {TIE_RISE * scale:.2g} {unit} of the chosen one's at {', '.join(tied)}: "
                                 "a tie on the selection batches, broken by the largest rise"))
    probs = np.asarray(probs, dtype=np.float64)
    overruled = [f"{site} ({name} over {candidates[int(row.argmax())]} {row.max():.3f})" for site, name, row in zip(sites, chosen, probs)
                 if list(candidates).index(name) != int(row.argmax())]
    if overruled:
        what = "the genotype scores" if scored else "the loss rises"
        notes.append(("overruled", f"{what} overruled the largest probability at {', '.join(overruled)}"))
    undecided = [site for site, row in zip(sites, probs) if not clear_winner(row)]
    if undecided:
        notes.append(("undecided", f"no clear winner (top probability leads the runner-up by less than 0.15) at {', '.join(undecided)}"))
    return notes
