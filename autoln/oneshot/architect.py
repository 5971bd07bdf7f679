"""The bilevel step (DARTS, Liu et al. 2019, §2.3, eq. 3-8; docs/design.md §4).

:class:`Architect` owns the alpha optimizer and computes the architecture gradient; its
narrow interface (``step``, ``gradient``, ``state_dict``, ``load_state_dict``) is all the
search loop uses. :func:`weight_step` is the inner update of the weights.

The alpha objective on a D_alpha batch is
``L_alpha = CE + zero_one_weight * zero_one(alpha) + lambda(step) * mean(logsumexp(alpha))``
(Fair DARTS' zero-one loss; beta-DARTS with ``lambda`` rising linearly to ``beta_reg_max``).

- First order: ``g = grad_alpha L_alpha(w, alpha)``.
- Second order: virtual step ``w' = w - xi grad_w L_w(w, alpha)`` on the D_w batch, then
  ``g = grad_alpha L_alpha(w', alpha) - xi [grad_alpha L_w(w+, alpha) - grad_alpha L_w(w-, alpha)] / (2 eps)``
  with ``w± = w ± eps v``, ``v = grad_w' L_alpha(w', alpha)``, ``eps = 0.01 / ||v||``
  (DARTS eq. 7-8). The weights are restored bitwise from a copy afterwards, and the weight
  optimizer is never touched.

With a stochastic mixing (Gumbel) one noise draw serves every pass of one step, and with dropout
the passes on the D_w batch (the virtual step and the two finite-difference passes at ``w±``)
replay one dropout mask (:func:`rng_state` / :func:`set_rng_state`): the three evaluate one
function ``L_w(., alpha)``, so the finite difference compares like with like and approximates
the exact hypergradient of DARTS eq. 7 under that mask. The replays leave the generator where
the ``L_alpha`` pass left it, so the next weight step draws fresh masks. Under bf16 autocast the two finite-difference passes
run in fp32 (:func:`autoln.models.model.full_precision`).

Under ``torchrun`` every gradient is averaged over the processes as soon as it is computed
(:func:`autoln.core.distributed.average_`): the virtual step's, ``v``, and the final ``g_alpha``
(linear in the per-process batches once ``w'`` and ``v`` are shared), so every process takes the
same alpha step.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from autoln.core import distributed
from autoln.config import SearchConfig
from autoln.space.mixing import Noise, beta_regulariser, linear, zero_one_loss
from autoln.models.model import full_precision
from autoln.models.supernet import Supernet
from autoln.engine.training import finish_step, on_cuda

Batch = tuple[torch.Tensor, torch.Tensor]


def rng_state(device: torch.device) -> tuple:
    """The generator state that dropout masks (and Gumbel noise) are drawn from: torch's CPU
    generator and, on CUDA, ``device``'s generator. Pass it to :func:`set_rng_state` to make
    the next forward pass draw the same masks as the one that followed this call."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def set_rng_state(state: tuple, device: torch.device) -> None:
    """Restore a state from :func:`rng_state`."""
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _global_norm(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(t) for t in tensors]))


class Architect:
    """Updates the supernet's alphas with Adam (DARTS' betas
    (0.5, 0.999), weight decay 1e-3, from ``cfg.arch_*``), first- or second-order.

    Args:
        model: the supernet.
        cfg: search settings (``order``, ``zero_one_weight``, ``beta_reg_max``, ``steps``).
    """

    def __init__(self, model: Supernet, cfg: SearchConfig) -> None:
        self.model, self.cfg = model, cfg
        self.optimizer = torch.optim.Adam(model.arch_parameters(), lr=cfg.arch_lr, betas=cfg.arch_betas,
                                          weight_decay=cfg.arch_weight_decay, fused=on_cuda(model.alphas) or None)

    # --- objectives ------------------------------------------------------------------------

    def _ce(self, batch: Batch, gumbel: Noise) -> torch.Tensor:
        x, y = batch
        return self.model(x, y, mix=self.model.mixing_weights(gumbel))[1]

    def alpha_objective(self, batch: Batch, gumbel: Noise, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(L_alpha with regularisers, its cross-entropy part)``, scalars; ``batch`` ``(B, T)`` pairs."""
        ce = self._ce(batch, gumbel)
        total = ce
        for alphas in self.model.arch_parameters():  # the sites' alphas, then the QK-norm's where searched
            if self.cfg.zero_one_weight > 0:
                total = total + self.cfg.zero_one_weight * zero_one_loss(alphas)
            lam = linear(0.0, self.cfg.beta_reg_max, step, self.cfg.steps)
            if lam > 0:
                total = total + lam * beta_regulariser(alphas)
        return total, ce

    # --- second-order pieces -----------------------------------------------------------------

    def virtual_step(self, batch_w: Batch, xi: float, gumbel: Noise = None) -> list[torch.Tensor]:
        """Set the weights in place to ``w' = w - xi * grad_w L_w(w, alpha)`` and return copies
        of the original weights (pass them to :meth:`restore`)."""
        weights = self.model.weight_parameters()
        backup = [p.detach().clone() for p in weights]
        grads = torch.autograd.grad(self._ce(batch_w, gumbel), weights)
        distributed.average_(grads)
        with torch.no_grad():
            for p, g in zip(weights, grads):
                p.sub_(xi * g)
        return backup

    def restore(self, backup: list[torch.Tensor]) -> None:
        """Copy the saved weights back (bitwise)."""
        with torch.no_grad():
            for p, b in zip(self.model.weight_parameters(), backup):
                p.copy_(b)

    def hessian_vector_product(self, backup: list[torch.Tensor], v: list[torch.Tensor], batch_w: Batch,
                               gumbel: Noise = None, rng: Optional[tuple] = None) -> list[torch.Tensor]:
        """``[grad_alpha L_w(w+, alpha) - grad_alpha L_w(w-, alpha)] / (2 eps)`` with
        ``w± = w ± eps v``, ``eps = 0.01 / ||v||`` (DARTS eq. 8); one tensor per architecture
        parameter (:meth:`autoln.models.supernet.SupernetMixin.arch_parameters`), shaped like it.
        ``backup`` holds ``w``; the weights are left at ``w-`` (call :meth:`restore`).
        ``rng``: a :func:`rng_state` that both passes replay (the virtual step's dropout mask);
        the generator is then left as it was found. None: the passes draw on."""
        arch = self.model.arch_parameters()
        norm = _global_norm(v)
        if norm == 0:
            return [torch.zeros_like(a) for a in arch]
        eps = 0.01 / norm
        weights = self.model.weight_parameters()
        device = arch[0].device
        resume = rng_state(device) if rng is not None else None
        grads = []
        for sign in (1.0, -1.0):
            with torch.no_grad():
                for p, b, d in zip(weights, backup, v):
                    p.copy_(b).add_(d, alpha=float(sign * eps))
            if rng is not None:
                set_rng_state(rng, device)
            with full_precision(self.model):
                grads.append(torch.autograd.grad(self._ce(batch_w, gumbel), arch, allow_unused=True))
        if resume is not None:
            set_rng_state(resume, device)
        return [torch.zeros_like(a) if gp is None else (gp - gm) / (2 * eps) for a, gp, gm in zip(arch, *grads)]

    # --- the update ----------------------------------------------------------------------------

    def gradient(self, batch_w: Batch, batch_alpha: Batch, xi: float, step: int,
                 gumbel: Optional[Noise] = None) -> tuple[float, torch.Tensor]:
        """The architecture gradient of ``cfg.order`` without applying it.

        Args:
            batch_w: a D_w batch (used by the second order only); batch_alpha: a D_alpha batch.
            xi: the virtual step's learning rate (the current weight lr).
            step: the search step (for the beta-DARTS schedule).
            gumbel: the step's Gumbel noise (None: deterministic, or drawn by the model).

        Returns:
            ``(cross-entropy L_alpha in nats/token, g_alpha)``: ``g_alpha`` one tensor per
            architecture parameter, shaped like it (the sites' alphas first), None for one the
            loss does not reach (the QK-norm's alphas once the read-off fixed its choice: no
            update, not even Adam's momentum, moves them then).
        """
        arch = self.model.arch_parameters()
        if self.cfg.order == 1:
            total, ce = self.alpha_objective(batch_alpha, gumbel, step)
            g = list(torch.autograd.grad(total, arch, allow_unused=True))
        else:
            weights = self.model.weight_parameters()
            rng = rng_state(arch[0].device)  # the virtual step's dropout mask, replayed at w+ and w-
            backup = self.virtual_step(batch_w, xi, gumbel)
            try:
                total, ce = self.alpha_objective(batch_alpha, gumbel, step)
                grads = torch.autograd.grad(total, weights + arch, allow_unused=True)
                v, g_direct = list(grads[:len(weights)]), grads[len(weights):]
                distributed.average_(v)
                hvp = self.hessian_vector_product(backup, v, batch_w, gumbel, rng)
            finally:
                self.restore(backup)
            g = [None if gd is None else gd - xi * h for gd, h in zip(g_direct, hvp)]
        ce = ce.detach().reshape(1).clone()
        distributed.average_([*(t for t in g if t is not None), ce])
        return ce.item(), g

    def step(self, batch_w: Batch, batch_alpha: Batch, xi: float, step: int) -> float:
        """One alpha update (first- or second-order per ``cfg.order``); the weights and their
        optimizer are unchanged. Returns the cross-entropy ``L_alpha`` in nats/token, or NaN
        when the loss or the alpha gradient is not finite: the update is then not applied."""
        gumbel = self.model.draw_gumbel()
        loss, g = self.gradient(batch_w, batch_alpha, xi, step, gumbel)
        if not (math.isfinite(loss) and all(t is None or bool(torch.isfinite(t).all()) for t in g)):
            return math.nan
        self.optimizer.zero_grad(set_to_none=True)
        for a, t in zip(self.model.arch_parameters(), g):
            a.grad = t  # None: Adam leaves the parameter as it is
        self.optimizer.step()
        return loss

    def state_dict(self) -> dict:
        """The alpha optimizer's state (the alphas themselves live in the model's state_dict)."""
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.optimizer.load_state_dict(state["optimizer"])


def weight_step(model: Supernet, optimizer: torch.optim.Optimizer, scheduler, x: torch.Tensor, y: torch.Tensor,
                grad_clip: float, noise: float = 0.0) -> tuple[float, float]:
    """One weight update on a D_w batch ``x, y`` ``(B, T)``: gradients reach the weights only
    (``backward(inputs=weights)``), clipped to ``grad_clip``; then the scheduler steps.
    ``noise``: SDARTS-RS uniform noise on the mixing weights (Chen & Hsieh 2020).

    Under ``torchrun`` the gradients and the loss are averaged over the processes.

    Returns ``(L_w in nats/token, gradient norm before clipping)``.
    """
    weights = model.weight_parameters()
    optimizer.zero_grad(set_to_none=True)
    _, loss = model(x, y, mix=model.mixing_weights(model.draw_gumbel(), noise).detach())  # no path to the alphas
    loss.backward(inputs=weights)
    return finish_step(weights, loss, optimizer, scheduler, grad_clip)


def single_paths(model: Supernet, strict: bool) -> list[torch.Tensor]:
    """The one-hot mixing weights of one single-path weight step, in the layout of
    :meth:`autoln.models.supernet.SupernetMixin.mixing_weights`: with ``strict``, FairNAS's strict
    fairness (Chu et al. 2021, §3.2): ``K`` paths, each site taking every candidate exactly once
    (a random permutation per site); else SPOS's one path of uniformly drawn candidates (Guo et
    al. 2020, §3.1). Sites fixed by a read-off (``projected``) keep their candidate. Draws from
    torch's global generator on the alphas' device."""
    n_sites, k = model.alphas.shape
    device = model.alphas.device
    if strict:
        choice = torch.stack([torch.randperm(k, device=device) for _ in range(n_sites)])  # (n_sites, K): path j's candidates
    else:
        choice = torch.randint(0, k, (n_sites, 1), device=device)
    for site, fixed in model.projected.items():
        choice[site] = fixed
    eye = torch.eye(k, device=device, dtype=model.alphas.dtype)
    return [model.arrange(eye[choice[:, j]]) for j in range(choice.shape[1])]


def single_path_step(model: Supernet, optimizer: torch.optim.Optimizer, scheduler, x: torch.Tensor, y: torch.Tensor,
                     grad_clip: float, noise: float = 0.0, strict: bool = True) -> tuple[float, float]:
    """One weight update of single-path training on a D_w batch ``x, y`` ``(B, T)``: the paths of
    :func:`single_paths` (FairNAS's ``K`` with ``strict``, SPOS's one without), each a one-hot
    supernet, which is exactly its derived model; their mean loss is back-propagated to the
    weights only, then one clipped optimizer step (FairNAS Alg. 1: gradients of the ``K`` paths
    accumulated before one update). This ends the co-adaptation of the shared weights to the
    mixture: each weight is trained inside whole derived models. ``noise`` is unused (SDARTS'
    noise perturbs a mixture). Under ``torchrun`` the paths are the same on every process (one
    generator) and the gradients are averaged.

    Returns ``(mean L_w over the paths in nats/token, gradient norm before clipping)``."""
    weights = model.weight_parameters()
    optimizer.zero_grad(set_to_none=True)
    paths = single_paths(model, strict)
    total = None
    for mix in paths:
        _, loss = model(x, y, mix=mix)
        (loss / len(paths)).backward(inputs=weights)
        total = loss.detach() if total is None else total + loss.detach()
    return finish_step(weights, total / len(paths), optimizer, scheduler, grad_clip)


def fair_step(*args, **kwargs) -> tuple[float, float]:
    """:func:`single_path_step` with FairNAS's strict fairness."""
    return single_path_step(*args, **kwargs, strict=True)


def spos_step(*args, **kwargs) -> tuple[float, float]:
    """:func:`single_path_step` with SPOS's one uniform path."""
    return single_path_step(*args, **kwargs, strict=False)


#: How the shared weights are trained, by ``search.weight_mode``: ``mixed`` (DARTS: the relaxed
#: mixture), ``fair`` (FairNAS: every candidate of every site once per step), ``spos`` (one
#: uniformly drawn path per step).
WEIGHT_STEPS = {"mixed": weight_step, "fair": fair_step, "spos": spos_step}
