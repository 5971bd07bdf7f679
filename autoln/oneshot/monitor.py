"""Collapse monitor (docs/design.md §4, "options against collapse"): at each evaluation, the
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

from autoln.core.modes import eval_mode
from autoln.space.mixing import site_entropy
from autoln.models.model import full_precision
from autoln.models.supernet import Supernet

#: R-DARTS rule, as Zela et al.'s reference code (automl/RobustDARTS, ``EVLocalAvg.early_stop``,
#: defaults ``window=5, delta=2, factor=1.3, es_start_epoch=20`` of 50 epochs): the local
#: average of the eigenvalue over the last WINDOW evaluations is compared with the local average
#: DELTA evaluations earlier; above RATIO times it, the search stops and returns the architecture
#: of the evaluation LAG = WINDOW // 2 + DELTA evaluations before the current one (the centre of
#: the earlier window: before the rise). No stop returns an evaluation before START_FRACTION of
#: the search's steps (20 of 50 epochs in the reference).
RATIO, WINDOW, DELTA, START_FRACTION = 1.3, 5, 2, 0.4
LAG = WINDOW // 2 + DELTA


def alpha_hessian(model: Supernet, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Exact Hessian of the cross-entropy ``L(w, alpha)`` on the batch ``x, y`` ``(B, T)`` w.r.t.
    the alphas, through the deterministic relaxed mixing weights (no Gumbel noise, no
    dropout), as a symmetric ``(n_sites * K, n_sites * K)`` matrix.

    Uses ``torch.autograd.functional.hessian`` over ``functional_call``; attention runs on
    SDPA's math backend, which supports double backward, in fp32 and with compiled blocks run
    eagerly (compiled graphs have no double backward).
    """
    alphas = model.alphas.detach()

    def loss(a: torch.Tensor) -> torch.Tensor:
        return functional_call(model, {"alphas": a}, (x, y))[1]

    with eval_mode(model), sdpa_kernel(SDPBackend.MATH), full_precision(model), torch.compiler.set_stance("force_eager"):
        h = torch.autograd.functional.hessian(loss, alphas)
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
    """History of the monitored quantities, one entry per evaluation (``steps``, argmax
    ``genotypes``, ``probabilities`` ``(n_sites, K)`` as lists; with a Hessian batch also
    ``eigenvalues`` and their local averages ``smoothed``).

    ``update`` returns the evaluation's record: ``entropy`` (per site, nats),
    ``mean_entropy``, ``genotype`` (argmax indices), ``genotype_changed``, ``stop`` (the
    R-DARTS rule fired) and, with a Hessian batch, ``eigenvalue`` and ``eigenvalue_smoothed``.
    ``total_steps``: the search's length, for the rule's START_FRACTION (0: no such guard).
    """

    eigenvalues: list[float] = field(default_factory=list)
    smoothed: list[float] = field(default_factory=list)
    genotypes: list[list[int]] = field(default_factory=list)
    probabilities: list[list[list[float]]] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    total_steps: int = 0

    def update(self, model: Supernet, batch: Optional[tuple[torch.Tensor, torch.Tensor]] = None, step: int = 0) -> dict:
        """Record the evaluation at search step ``step``. ``batch``: the fixed ``(x, y)``
        ``(B, T)`` batch for the Hessian, or None to track only entropies and genotype changes
        (no eigenvalue, no stop)."""
        probs = torch.from_numpy(model.probabilities())
        genotype = probs.argmax(-1).tolist()
        changed = bool(self.genotypes) and genotype != self.genotypes[-1]
        self.genotypes.append(genotype)
        self.probabilities.append(probs.tolist())
        self.steps.append(step)
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
        """R-DARTS: ``smoothed[t] / smoothed[t - DELTA] > RATIO``, once both local averages
        span a full WINDOW (``WINDOW + DELTA`` eigenvalues) and the evaluation the stop would
        return (:meth:`before_rise`) lies at or after ``START_FRACTION * total_steps``; a
        non-positive earlier average never triggers."""
        if len(self.eigenvalues) < WINDOW + DELTA or len(self.smoothed) <= DELTA:
            return False
        if len(self.steps) > LAG and self.steps[-1 - LAG] < START_FRACTION * self.total_steps:
            return False
        before = self.smoothed[-1 - DELTA]
        return before > 0 and self.smoothed[-1] / before > RATIO

    def before_rise(self) -> tuple[int, list[list[float]]]:
        """``(step, probabilities (n_sites, K))`` of the evaluation LAG evaluations before the
        last one: the architecture R-DARTS returns when it stops (Zela et al. 2020, §5.1:
        "DARTS-ES ... returns the architecture of epoch i - k").

        Raises:
            ValueError: fewer than ``LAG + 1`` evaluations recorded.
        """
        if len(self.probabilities) <= LAG:
            raise ValueError(f"R-DARTS needs {LAG + 1} evaluations, the monitor holds {len(self.probabilities)}")
        return self.steps[-1 - LAG], self.probabilities[-1 - LAG]
