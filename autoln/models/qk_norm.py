"""The QK-norm module: a norm on an attention's queries and keys, one candidate or several (docs/design.md §2).

:class:`QKNorm` is what an attention calls on its ``q`` and ``k`` before the dot product
(``q, k = self.qk_norm(q, k)``, heads not yet split). With one candidate it is the derived
model's; with several the supernet's, mixing the candidates' outputs by its own mixing weights,
``q' = sum_c w_c f_c(q)`` and ``k' = sum_c w_c g_c(k)`` (DARTS' mixed operation, Liu et al. 2019,
eq. 2, over the candidates of :data:`autoln.space.qk.QK_NORMS`), so one-hot weights give the
derived model exactly. The weights come from the search (:attr:`QKNorm.mix`, set by
:class:`autoln.models.supernet.SupernetMixin` around each forward pass).

Shapes: ``q``, ``k`` ``(..., d_model)``; mixing weights ``(Q,)`` over the candidates.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
from torch import nn

from autoln.space.placements import NORMS
from autoln.space.qk import QK_NORMS, check_qk_candidates


class QKNorm(nn.Module):
    """QK-norm of one attention layer: for each candidate other than ``none``, a norm for the
    queries and one for the keys (:mod:`autoln.space.qk`), applied before the heads' dot product.

    Args:
        candidates: names of :data:`autoln.space.qk.QK_NORMS` (``["qk"]`` for a model with
            QK-norm; several to search it), in the order of the mixing weights.
        d_model: the width of ``q`` and ``k``; n_heads: the number of heads (``qk`` normalises
            each head's ``d_model / n_heads`` channels).
        norm: a key of :data:`autoln.space.placements.NORMS` (``rmsnorm`` for OLMo 2, Gemma 3, Qwen 3).
        bias: the norms carry a learnable bias (as ``nn.LayerNorm``; False as nanoGPT's ``bias=False``).

    Raises:
        ValueError: unknown or repeated candidates, ``d_model`` or ``n_heads`` not a positive
            integer or ``d_model`` not divisible by ``n_heads``, an unknown ``norm``, ``bias`` not a bool.
    """

    def __init__(self, candidates: Sequence[str] = ("qk",), d_model: int = 64, n_heads: int = 1, norm: str = "layernorm",
                 bias: bool = True) -> None:
        super().__init__()
        cands = check_qk_candidates(candidates, "autoln.QKNorm: candidates")
        for name, v in (("d_model", d_model), ("n_heads", n_heads)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"autoln.QKNorm: {name}: expected a positive integer, got {v!r}")
        if d_model % n_heads:
            raise ValueError(f"autoln.QKNorm: d_model ({d_model!r}) must be a positive multiple of n_heads ({n_heads!r})")
        if norm not in NORMS:
            raise ValueError(f"autoln.QKNorm: norm: expected one of {list(NORMS)}, got {norm!r}")
        if not isinstance(bias, bool):
            raise ValueError(f"autoln.QKNorm: bias: expected True or False, got {bias!r}")
        self.candidates, self.d_model, self.n_heads = cands, d_model, n_heads
        width = {"head": d_model // n_heads, "model": d_model}
        self.q_norms = nn.ModuleDict({c: NORMS[norm](width[QK_NORMS[c]], True, bias) for c in cands if QK_NORMS[c]})
        self.k_norms = nn.ModuleDict({c: NORMS[norm](width[QK_NORMS[c]], True, bias) for c in cands if QK_NORMS[c]})
        #: The mixing weights ``(Q,)`` of the current forward pass of a searched QK-norm (set and
        #: cleared by the supernet); None otherwise.
        self.mix: Optional[torch.Tensor] = None
        #: The module name in its model, for error messages (set by the supernet).
        self.name: Optional[str] = None

    def one(self, name: str, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Candidate ``name``'s ``(q, k)``, each ``(..., d_model)``."""
        span = QK_NORMS[name]
        if span is None:
            return q, k
        if span == "model":
            return self.q_norms[name](q), self.k_norms[name](k)
        heads = (*q.shape[:-1], self.n_heads, self.d_model // self.n_heads)
        qn = self.q_norms[name](q.reshape(heads)).reshape(q.shape)
        kn = self.k_norms[name](k.reshape(*k.shape[:-1], *heads[-2:])).reshape(k.shape)
        return qn, kn

    def forward(self, q: torch.Tensor, k: torch.Tensor, weights: Optional[torch.Tensor] = None):
        """``(q, k)`` normed: each ``(..., d_model)``, heads not yet split. ``weights`` ``(Q,)``
        (several candidates: given, or set in :attr:`mix` by the search). Returns ``(q', k')``
        shaped as the inputs.

        Raises:
            ValueError: ``q`` or ``k`` not a tensor or whose last dimension is not ``d_model``;
                several candidates and no mixing weights (a searched QK-norm outside a
                supernet), or weights not one per candidate."""
        where = f"autoln.QKNorm {self.name!r}" if self.name else "autoln.QKNorm"
        for what, t in (("q", q), ("k", k)):
            if not isinstance(t, torch.Tensor) or t.dim() < 1:
                got = f"a {type(t).__name__}" if not isinstance(t, torch.Tensor) else "a 0-d tensor"
                raise ValueError(f"{where}: {what}: expected a tensor (..., d_model={self.d_model}), got {got}")
            if t.shape[-1] != self.d_model:
                raise ValueError(f"{where}: {what} has last dimension {t.shape[-1]}, expected d_model={self.d_model} "
                                 "(call it on q and k before splitting them into heads)")
        if len(self.candidates) == 1:
            return self.one(self.candidates[0], q, k)
        weights = self.mix if weights is None else weights
        if weights is None:
            from autoln.models.site import _HELD, in_backward

            weights = _HELD.get(self) if in_backward() else None
        if weights is None:
            raise ValueError(f"a QK-norm with several candidates ({self.candidates}) needs mixing weights: run the model "
                             "inside its supernet (autoln.SearchModel), or derive it to one candidate first")
        if weights.shape != (len(self.candidates),):
            raise ValueError(f"{where}: weights: expected one per candidate, shape ({len(self.candidates)},), "
                             f"got {tuple(weights.shape)}")
        mq = mk = None
        for c, w in zip(self.candidates, weights):
            qc, kc = self.one(c, q, k)
            mq = w * qc if mq is None else mq + w * qc
            mk = w * kc if mk is None else mk + w * kc
        return mq, mk

    def extra_repr(self) -> str:
        return f"candidates={self.candidates}, n_heads={self.n_heads}"
