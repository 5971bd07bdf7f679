"""The bilevel step (DARTS, Liu et al. 2019, §2.3, eq. 3-8): alphas on D_alpha, weights on D_w.

:class:`Architect` owns the alpha optimizer and computes the architecture gradient; its
narrow interface (``step``, ``state_dict``, ``load_state_dict``) is all the search loop uses.
First order (``g_alpha = grad_alpha L_alpha(w, alpha)``, DARTS eq. 6 with ``xi = 0``).
:func:`weight_step` is the inner update of the weights.
"""

from __future__ import annotations

import torch

from .config import SearchConfig
from .supernet import Supernet
from .training import clip_and_norm


class Architect:
    """Updates the supernet's alphas with Adam (DARTS defaults: lr 3e-4, betas (0.5, 0.999),
    weight decay 1e-3, taken from ``cfg.arch_*``).

    Args:
        model: the supernet.
        cfg: search settings.
    """

    def __init__(self, model: Supernet, cfg: SearchConfig) -> None:
        self.model = model
        self.optimizer = torch.optim.Adam(model.arch_parameters(), lr=cfg.arch_lr, betas=cfg.arch_betas,
                                          weight_decay=cfg.arch_weight_decay)

    def step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """One first-order alpha update on a D_alpha batch ``x, y`` ``(B, T)``.

        Only the alphas' gradient is computed (``torch.autograd.grad``), so no weight gradient
        is formed or accumulated and the weights are untouched. Returns ``L_alpha`` in nats/token.
        """
        alphas = self.model.arch_parameters()
        self.optimizer.zero_grad(set_to_none=True)
        _, loss = self.model(x, y)
        grads = torch.autograd.grad(loss, alphas)
        for p, g in zip(alphas, grads):
            p.grad = g
        self.optimizer.step()
        return loss.item()

    def state_dict(self) -> dict:
        """The alpha optimizer's state (the alphas themselves live in the model's state_dict)."""
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.optimizer.load_state_dict(state["optimizer"])


def weight_step(model: Supernet, optimizer: torch.optim.Optimizer, scheduler, x: torch.Tensor, y: torch.Tensor, grad_clip: float) -> tuple[float, float]:
    """One weight update on a D_w batch ``x, y`` ``(B, T)``: gradients reach the weights only
    (``backward(inputs=weights)``), clipped to ``grad_clip``; then the scheduler steps.

    Returns ``(L_w in nats/token, gradient norm before clipping)``.
    """
    weights = model.weight_parameters()
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(x, y)
    loss.backward(inputs=weights)
    norm = clip_and_norm(weights, grad_clip)
    optimizer.step()
    scheduler.step()
    return loss.item(), norm
