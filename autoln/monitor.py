"""Collapse monitor (DESIGN §4; issue "options against collapse"): at each evaluation, the
largest eigenvalue of the Hessian of the alpha loss w.r.t. the alphas (exact: there are only
``n_sites * K`` alphas), each site's entropy, and whether the genotype changed; plus the
R-DARTS early-stopping rule (Zela et al. 2020, "Understanding and Robustifying DARTS").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from .mixing import site_entropy
from .model import full_precision
from .supernet import Supernet

#: R-DARTS rule: stop when the smoothed eigenvalue exceeds RATIO times its value LAG
#: evaluations earlier; smoothing is the mean over the last WINDOW evaluations.
RATIO, LAG, WINDOW = 1.3, 4, 4


def alpha_hessian(model: Supernet, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Exact Hessian of the cross-entropy ``L(w, alpha)`` on the batch ``x, y`` ``(B, T)`` w.r.t.
    the alphas, through the deterministic relaxed mixing weights (no Gumbel noise, no
    dropout), as a symmetric ``(n_sites * K, n_sites * K)`` matrix.

    Uses ``torch.autograd.functional.hessian`` over ``functional_call``; attention runs on
    SDPA's math backend, which supports double backward, in fp32 and with compiled blocks run
    eagerly (compiled graphs have no double backward).
    """
    was_training = model.training
    model.eval()
    alphas = model.alphas.detach()

    def loss(a: torch.Tensor) -> torch.Tensor:
        return functional_call(model, {"alphas": a}, (x, y))[1]

    try:
        with sdpa_kernel(SDPBackend.MATH), full_precision(model), torch.compiler.set_stance("force_eager"):
            h = torch.autograd.functional.hessian(loss, alphas)
    finally:
        model.train(was_training)
    n = alphas.numel()
    h = h.reshape(n, n)
    return 0.5 * (h + h.T)


def max_eigenvalue(hessian: torch.Tensor) -> float:
    """Largest (algebraic) eigenvalue of a symmetric matrix, via ``numpy.linalg.eigvalsh``;
    NaN when the matrix holds NaN or inf (e.g. a search going on under ``skip_batch`` after
    its weights blew up), which never triggers the R-DARTS stop."""
    h = hessian.detach().double().cpu().numpy()
    if not np.isfinite(h).all():
        return float("nan")
    return float(np.linalg.eigvalsh(h)[-1])


@dataclass
class CollapseMonitor:
    """History of the monitored quantities, one entry per evaluation.

    ``update`` returns the evaluation's record: ``entropy`` (per site, nats),
    ``mean_entropy``, ``genotype`` (argmax indices), ``genotype_changed``, ``stop`` (the
    R-DARTS rule fired) and, with a Hessian batch, ``eigenvalue`` and ``eigenvalue_smoothed``.
    """

    eigenvalues: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    genotypes: list[list[int]] = field(default_factory=list)

    def update(self, model: Supernet, batch: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> dict:
        """Record one evaluation. ``batch``: the fixed ``(x, y)`` ``(B, T)`` batch for the
        Hessian, or None to track only entropies and genotype changes (no eigenvalue, no stop)."""
        probs = torch.from_numpy(model.probabilities())
        genotype = probs.argmax(-1).tolist()
        changed = bool(self.genotypes) and genotype != self.genotypes[-1]
        self.genotypes.append(genotype)
        entropy = site_entropy(probs)
        record = {"entropy": entropy.tolist(), "mean_entropy": float(entropy.mean()), "genotype": genotype,
                  "genotype_changed": changed, "stop": False}
        if batch is not None:
            lam = max_eigenvalue(alpha_hessian(model, *batch))
            self.eigenvalues.append(lam)
            self.smoothed.append(float(np.mean(self.eigenvalues[-WINDOW:])))
            record.update(eigenvalue=lam, eigenvalue_smoothed=self.smoothed[-1], stop=self.should_stop())
        return record

    def should_stop(self) -> bool:
        """R-DARTS: ``smoothed[t] / smoothed[t - 4] > 1.3`` (needs 5 evaluations; a
        non-positive earlier value never triggers)."""
        if len(self.smoothed) <= LAG:
            return False
        before = self.smoothed[-1 - LAG]
        return before > 0 and self.smoothed[-1] / before > RATIO
