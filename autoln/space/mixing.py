"""Mixing functions: how a site's alphas become the weights of its candidates (docs/design.md §3-4).

Each entry of :data:`MIXINGS` maps ``alphas (n_sites, K)``, a temperature ``tau`` and
optional Gumbel noise ``g (n_sites, K)`` to mixing weights ``(n_sites, K)``. With ``g`` (drawn
by :func:`draw_gumbel` once per training step) the stochastic form is used; without it, the
deterministic *relaxed* weights, used for evaluation, the Hessian monitor and the genotype's
probabilities.

| name | with noise ``g`` (training) | without (relaxed) | source |
|---|---|---|---|
| ``softmax`` | ``softmax(alpha / tau)`` (no noise) | same | DARTS (Liu et al. 2019), eq. 2 |
| ``gumbel`` | ``softmax((alpha + g) / tau)`` | ``softmax(alpha / tau)`` | SNAS (Xie et al. 2019) |
| ``gumbel-hard`` | forward ``one_hot(argmax(alpha + g))``, backward the soft sample (straight-through) | ``softmax(alpha / tau)`` | GDAS (Dong & Yang 2019) |
| ``sigmoid`` | ``sigmoid(alpha)`` per candidate, independently (no noise) | same | Fair DARTS (Chu et al. 2020) |
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F


Noise = Optional[torch.Tensor]


def draw_gumbel(alphas: torch.Tensor) -> torch.Tensor:
    """Standard Gumbel noise ``-log(E)``, ``E ~ Exp(1)``, shaped like ``alphas`` (as
    ``torch.nn.functional.gumbel_softmax`` draws it), from torch's global generator."""
    return -torch.empty_like(alphas).exponential_().log()


def _softmax(alphas: torch.Tensor, tau: float, g: Noise) -> torch.Tensor:
    return torch.softmax(alphas / tau, dim=-1)


def _gumbel(alphas: torch.Tensor, tau: float, g: Noise) -> torch.Tensor:
    return torch.softmax((alphas if g is None else alphas + g) / tau, dim=-1)


def _gumbel_hard(alphas: torch.Tensor, tau: float, g: Noise) -> torch.Tensor:
    soft = _gumbel(alphas, tau, g)
    if g is None:
        return soft
    hard = F.one_hot(soft.argmax(-1), soft.shape[-1]).to(soft.dtype)
    return hard - soft.detach() + soft


def _sigmoid(alphas: torch.Tensor, tau: float, g: Noise) -> torch.Tensor:
    return torch.sigmoid(alphas)


#: Mixing functions by ``search.mixing`` name: ``f(alphas, tau, gumbel_noise_or_None) -> weights``.
MIXINGS: dict[str, Callable[[torch.Tensor, float, Noise], torch.Tensor]] = {
    "softmax": _softmax,
    "gumbel": _gumbel,
    "gumbel-hard": _gumbel_hard,
    "sigmoid": _sigmoid,
}
def probabilities(alphas: torch.Tensor, tau: float, mixing: str) -> torch.Tensor:
    """The relaxed mixing weights of ``alphas`` ``(n_sites, K)`` normalised per site, in float64
    and in log space, so that no row underflows to ``0 / 0``: ``softmax(alpha / tau)`` for the
    softmax family (their relaxed form), ``softmax(logsigmoid(alpha)) = sigmoid(alpha) /
    sum(sigmoid(alpha))`` for ``sigmoid`` (whose three weights at alphas near -120 are each
    below float32's smallest number). ``(n_sites, K)``, rows summing to 1.

    Raises:
        KeyError: unknown ``mixing``.
    """
    if mixing not in MIXINGS:
        raise KeyError(mixing)
    a = alphas.detach().double()
    return torch.softmax(F.logsigmoid(a) if mixing == "sigmoid" else a / tau, dim=-1)


#: Mixing functions that draw Gumbel noise in training steps.
STOCHASTIC = ("gumbel", "gumbel-hard")


def zero_one_loss(alphas: torch.Tensor) -> torch.Tensor:
    """Fair DARTS' zero-one loss ``-mean((sigmoid(alpha) - 0.5)^2)`` (Chu et al. 2020, eq. 4):
    0 at sigmoid 0.5, its minimum -0.25 at sigmoid 0 or 1. Scalar."""
    return -torch.mean((torch.sigmoid(alphas) - 0.5) ** 2)


def beta_regulariser(alphas: torch.Tensor) -> torch.Tensor:
    """beta-DARTS' regulariser ``mean_sites(logsumexp(alpha))`` (Ye et al. 2022, eq. 9). Scalar."""
    return torch.logsumexp(alphas, dim=-1).mean()


def linear(start: float, end: float, step: int, total: int) -> float:
    """Linear schedule from ``start`` at step 0 to ``end`` at ``total`` (clamped), e.g. the
    Gumbel temperature (SNAS, GDAS) or beta-DARTS' lambda."""
    if total <= 0:
        return end
    t = min(max(step / total, 0.0), 1.0)
    return start + (end - start) * t


def site_entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row of ``probs (n_sites, K)`` (rows normalised first); ``(n_sites,)``."""
    p = probs / probs.sum(-1, keepdim=True)
    return -(p * torch.log(p.clamp_min(1e-30))).sum(-1)
