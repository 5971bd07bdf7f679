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
     (:attr:`autoln.supernet.Supernet.projected`);
  4. fine-tune the supernet (bilevel steps, as the reference's ``proj_intv`` epochs of
     ``architect.step`` + weight step) before the next site.

Loss rises are in nats per token; positive means the candidate helps the supernet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import torch

from .config import SELECTIONS  # noqa: F401  (the names of search.selection)
from .supernet import Supernet

#: ``loss(mix)``: mean cross-entropy (nats/token) of the supernet on the fixed selection windows
#: with mixing weights ``mix`` ``(n_layers, 2, K)``.
LossFn = Callable[[torch.Tensor], float]
#: ``tune()``: the fine-tuning between two decisions (a few bilevel steps).
TuneFn = Callable[[], None]


@dataclass
class Selection:
    """The outcome of :func:`perturbation_select`.

    Attributes:
        choices: per site (rows of :func:`autoln.supernet.site_names`) the chosen candidate's index.
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


def clear_winner(row: np.ndarray, lead: float = 0.15) -> bool:
    """True when the top probability of ``row`` ``(K,)`` leads the runner-up by at least
    ``lead`` (the rule a decisive search is held to; a lead, not an absolute level, because
    with K candidates an absolute level says nothing about the runner-up)."""
    top2 = np.sort(np.asarray(row, dtype=np.float64))[-2:]
    return bool(len(row) < 2 or top2[1] - top2[0] >= lead)
