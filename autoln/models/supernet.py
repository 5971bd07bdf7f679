"""The supernet: every site mixes all candidate placements with ``softmax(alpha / tau)`` (docs/design.md §3).

Architecture parameters (alphas) are one registered parameter ``alphas`` of shape
``(n_sites, K)``: ``n_sites = n_layers`` for ``granularity: layer`` (both sublayers of a
block share a row) or ``2 * n_layers`` for ``sublayer`` (rows ``2i`` attention, ``2i+1`` FFN
of block ``i``). ``K = len(candidates)``. They are in ``state_dict``, move with ``.to()``
and work with DDP; :meth:`Supernet.arch_parameters` and :meth:`Supernet.weight_parameters`
partition ``parameters()``.
"""

from __future__ import annotations

import abc
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import numpy as np
import torch
from torch import nn

from autoln.config import ModelConfig
from autoln.space.mixing import MIXINGS, STOCHASTIC, Noise, draw_gumbel
from autoln.space.mixing import probabilities as mixing_probabilities
from autoln.models.model import TransformerLM
from autoln.models.qk_norm import QKNorm


def site_names(n_layers: int, granularity: str) -> list[str]:
    """Names of the alpha rows: ``block0, block1, ...`` (layer) or ``block0.attn, block0.ffn,
    ...`` (sublayer). Used in TensorBoard tags ``alpha/<site>/<candidate>``."""
    if granularity == "layer":
        return [f"block{i}" for i in range(n_layers)]
    return [f"block{i}.{s}" for i in range(n_layers) for s in ("attn", "ffn")]


class SupernetMixin(abc.ABC):
    """What makes a module a supernet, shared by :class:`Supernet` (autoln's own model) and
    :class:`autoln.api.SearchModel` (a user's model with :class:`autoln.models.site.Site` s): the
    architecture parameters ``alphas`` ``(n_sites, K)`` over ``candidates``, the mixing
    function and its temperature ``tau``, the sites fixed by perturbation-based selection
    (``projected``), and the narrow interface the architect, the selection and the search loop
    use. A subclass sets ``alphas``, ``candidates``, ``site_names``, ``tau``, ``mixing`` and
    ``projected`` in its ``__init__`` and implements :meth:`arrange`.
    """

    alphas: nn.Parameter
    candidates: list[str]
    site_names: list[str]
    tau: float
    mixing: str
    projected: dict[int, int]
    #: autocast dtype of the forward passes, None for fp32 (:func:`autoln.models.model.full_precision`).
    autocast_dtype = None
    #: The searched QK-norms' candidates and module names, set per instance by :meth:`init_qk`.
    qk_candidates: list[str]
    qk_site_names: list[str]
    #: The read-off's QK choices (candidate index per row, imposed one-hot), None while searching.
    qk_fixed: Optional[list] = None

    def init_qk(self, modules: Sequence[tuple[str, QKNorm]], arch_init_std: float, device=None) -> None:
        """Set :attr:`qk_alphas`, the QK-norm's own alphas ``(n_qk, Q)``, one row per searched
        :class:`QKNorm` (module order) over :attr:`qk_candidates`, or None where QK-norm is not
        searched; every subclass calls it in its ``__init__``. Give the searched QK-norms (``(module name, QKNorm)`` with two or more candidates, in
        module order) their own alphas ``(n_qk, Q)``, drawn as ``arch_init_std * randn`` from
        torch's global generator; none when ``modules`` is empty.

        Raises:
            ValueError: QK-norms with different candidate lists."""
        self._qk_modules = [m for _, m in modules]
        self._qk_active = False
        self.qk_candidates, self.qk_site_names = [], []
        if not modules:
            self.register_parameter("qk_alphas", None)
            return
        cands = list(modules[0][1].candidates)
        for name, m in modules:
            m.name = name
            if list(m.candidates) != cands:
                raise ValueError(f"QK-norm {name!r} offers {m.candidates} but {modules[0][0]!r} offers {cands}: every searched "
                                 "QK-norm needs the same candidates, in the same order")
        self.qk_candidates = cands
        self.qk_site_names = [n for n, _ in modules]
        self.qk_alphas = nn.Parameter(arch_init_std * torch.randn(len(modules), len(cands), device=device))

    def qk_weights(self) -> Optional[torch.Tensor]:
        """The searched QK-norms' mixing weights ``(n_qk, Q)``: one-hot at :attr:`qk_fixed` after
        the read-off, else the relaxed weights of the alphas' mixing function without noise
        (``softmax(qk_alphas / tau)``; stochastic mixings draw their noise for the sites
        only). None where QK-norm is not searched."""
        if self.qk_alphas is None:
            return None
        if self.qk_fixed is not None:
            eye = torch.eye(len(self.qk_candidates), device=self.qk_alphas.device, dtype=self.qk_alphas.dtype)
            return eye[torch.tensor(self.qk_fixed, device=self.qk_alphas.device)]
        return MIXINGS[self.mixing](self.qk_alphas, self.tau, None)

    @contextmanager
    def qk_mixing(self) -> Iterator[None]:
        """Inside the block every searched QK-norm mixes by its row of :meth:`qk_weights`; each
        keeps its row for backward's recomputation under activation checkpointing
        (:func:`autoln.models.site.hold_for_backward`). Entered again inside itself (``forward``
        calls ``hidden_states``), it keeps the weights it computed once."""
        if self._qk_active or self.qk_alphas is None:
            yield
            return
        from autoln.models.site import hold_for_backward

        weights = self.qk_weights()
        for m, row in zip(self._qk_modules, weights):
            m.mix = row
        self._qk_active = True
        try:
            yield
        finally:
            self._qk_active = False
            for m, row in zip(self._qk_modules, weights):
                m.mix = None
                if torch.is_grad_enabled():
                    hold_for_backward(m, row)

    def qk_probabilities(self) -> np.ndarray:
        """The QK-norms' probabilities ``(n_qk, Q)``, float64 (as :meth:`probabilities`); ``(0, 0)`` when not searched."""
        if self.qk_alphas is None:
            return np.zeros((0, 0))
        return mixing_probabilities(self.qk_alphas, self.tau, self.mixing).cpu().numpy()

    def qk_choices(self) -> list[str]:
        """The QK choice per searched QK-norm: :attr:`qk_fixed`, or the argmax of its alphas."""
        if self.qk_alphas is None:
            return []
        idx = self.qk_fixed if self.qk_fixed is not None else self.qk_alphas.detach().argmax(-1).tolist()
        return [self.qk_candidates[int(i)] for i in idx]

    def fix_qk(self) -> list[str]:
        """Read the QK choices off (the argmax of their alphas, DARTS' rule) and impose them one-hot
        (:attr:`qk_fixed`), before the sites' read-off. Returns the choices."""
        if self.qk_alphas is not None:
            self.qk_fixed = [int(i) for i in self.qk_alphas.detach().argmax(-1).tolist()]
        return self.qk_choices()

    def arch_parameters(self) -> list[nn.Parameter]:
        """The architecture parameters: ``[alphas]`` ``(n_sites, K)``, then ``qk_alphas``
        ``(n_qk, Q)`` where QK-norm is searched."""
        return [self.alphas] + ([self.qk_alphas] if self.qk_alphas is not None else [])

    def named_weight_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """``(name, parameter)`` for every parameter except the architecture parameters."""
        arch = {id(p) for p in self.arch_parameters()}
        return [(n, p) for n, p in self.named_parameters() if id(p) not in arch]

    def weight_parameters(self) -> list[nn.Parameter]:
        """Every parameter except the alphas (branch weights, norms, embeddings)."""
        return [p for _, p in self.named_weight_parameters()]

    def draw_gumbel(self) -> Noise:
        """Gumbel noise ``(n_sites, K)`` for one training step of a stochastic mixing
        (``gumbel``, ``gumbel-hard``) in training mode; None otherwise."""
        if self.mixing in STOCHASTIC and self.training:
            return draw_gumbel(self.alphas.detach())
        return None

    def site_weights(self, gumbel: Noise = None) -> torch.Tensor:
        """Mixing weights per site ``(n_sites, K)`` from :data:`autoln.space.mixing.MIXINGS`; without
        noise the deterministic relaxed weights (e.g. ``softmax(alphas / tau)``, DARTS eq. 2)."""
        return MIXINGS[self.mixing](self.alphas, self.tau, gumbel)

    @abc.abstractmethod
    def arrange(self, weights: torch.Tensor) -> torch.Tensor:
        """The per-site weights ``(n_sites, K)`` in the layout the forward pass takes (each
        subclass's own: ``(n_layers, 2, K)`` for :class:`Supernet`, as is for a user's model)."""

    def mixing_weights(self, gumbel: Noise = None, noise: float = 0.0, drop: tuple[int, int] | None = None) -> torch.Tensor:
        """The mixing weights in the layout of :meth:`arrange`. ``noise > 0`` adds
        ``U(-noise, noise)`` to each site's weights (SDARTS-RS, Chen & Hsieh 2020), for weight
        steps only. Sites in :attr:`projected` get one-hot weights. ``drop = (site, k)`` zeroes
        candidate ``k``'s weight at ``site`` without renormalising: the supernet with that
        candidate removed (DARTS-PT, Wang et al. 2021, §3.2, as ruocwang/darts-pt's
        ``project_op`` masks an operation)."""
        w = self.site_weights(gumbel)
        if noise > 0:
            w = w + torch.empty_like(w).uniform_(-noise, noise)
        if self.projected or drop is not None:
            keep = torch.ones_like(w)
            fixed = torch.zeros_like(w)
            for site, k in self.projected.items():
                keep[site] = 0.0
                fixed[site, k] = 1.0
            w = w * keep + fixed
            if drop is not None:
                mask = torch.ones_like(w)
                mask[drop] = 0.0
                w = w * mask
        return self.arrange(w)

    def probabilities(self) -> np.ndarray:
        """The genotype's probabilities ``(n_sites, K)``, float64 numpy: the relaxed weights
        normalised per site (softmax as is; sigmoid mixing divided by its row sum), computed in
        log space so that weights below float32's range give finite numbers
        (:func:`autoln.space.mixing.probabilities`)."""
        return mixing_probabilities(self.alphas, self.tau, self.mixing).cpu().numpy()


class Supernet(SupernetMixin, TransformerLM):
    """A :class:`TransformerLM` whose every site holds all of ``cfg.searched_candidates()``
    (``cfg.candidates``, in one or both gain forms per ``cfg.affine``); the alpha interface is
    :class:`SupernetMixin`'s.

    Args:
        cfg: model dimensions, ``candidates`` and ``granularity``.
        vocab_size: number of token ids.
        arch_init_std: alphas start as ``arch_init_std * randn`` (DARTS: 1e-3).
        tau: temperature of the mixing function (the search anneals it by setting ``.tau``).
        mixing: key of :data:`autoln.space.mixing.MIXINGS`.
        candidate_scale: ``raw`` or ``common`` (:func:`autoln.models.site.common_scale_mix`), set on every site.

    Raises:
        ValueError: unknown ``mixing``.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int, arch_init_std: float = 1e-3, tau: float = 1.0,
                 mixing: str = "softmax", candidate_scale: str = "raw") -> None:
        if mixing not in MIXINGS:
            raise ValueError(f"unknown mixing {mixing!r}; expected one of {list(MIXINGS)}")
        cands = cfg.searched_candidates()
        super().__init__(cfg, vocab_size, [(cands, cands)] * cfg.n_layers, [cfg.qk_norm] * cfg.n_layers)
        set_candidate_scale(self, candidate_scale)
        self.candidates = cands
        self.granularity = cfg.granularity
        self.tau = tau
        self.mixing = mixing
        self.site_names = site_names(cfg.n_layers, cfg.granularity)
        self.alphas = nn.Parameter(arch_init_std * torch.randn(len(self.site_names), len(cands)))
        #: Sites discretised by perturbation-based selection (:mod:`autoln.oneshot.selection`): site
        #: index -> chosen candidate index. Their mixing weights are one-hot; empty during the
        #: bilevel search. Not part of ``state_dict``: selection runs after the last checkpointed
        #: step and is re-run on resume.
        self.projected: dict[int, int] = {}
        searched = [(f"block{i}.qk", b.attn.qk_norm) for i, b in enumerate(self.blocks) if len(cfg.qk_norm) > 1]
        self.init_qk(searched, arch_init_std)  # drawn after the alphas: a config without QK-norm starts as before

    def arrange(self, weights: torch.Tensor) -> torch.Tensor:
        """Per block and sublayer ``(n_layers, 2, K)`` (layer granularity repeats a row)."""
        if self.granularity == "layer":
            return weights.unsqueeze(1).expand(-1, 2, -1)
        return weights.view(-1, 2, weights.shape[-1])

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, mix: torch.Tensor | None = None):
        """As :meth:`TransformerLM.forward`; unless ``mix`` is given, mixes with
        :meth:`mixing_weights` (with fresh Gumbel noise in training mode for stochastic mixings)."""
        with self.qk_mixing():
            return super().forward(idx, targets, self.mixing_weights(self.draw_gumbel()) if mix is None else mix)

    def hidden_states(self, idx: torch.Tensor, mix: torch.Tensor | None = None) -> list[torch.Tensor]:
        """As :meth:`TransformerLM.hidden_states` (``n_layers + 1`` tensors ``(B, T, d_model)``),
        mixing with the deterministic relaxed weights unless ``mix`` is given."""
        with self.qk_mixing():
            return super().hidden_states(idx, self.mixing_weights() if mix is None else mix)


def set_candidate_scale(model: nn.Module, candidate_scale: str) -> None:
    """Set ``candidate_scale`` (:data:`autoln.models.site.CANDIDATE_SCALES`) on every searched site of ``model``.

    Raises:
        ValueError: an unknown value."""
    from autoln.models.site import CANDIDATE_SCALES, Site

    if candidate_scale not in CANDIDATE_SCALES:
        raise ValueError(f"unknown candidate_scale {candidate_scale!r}; expected one of {list(CANDIDATE_SCALES)}")
    for m in model.modules():
        if isinstance(m, Site):
            m.candidate_scale = candidate_scale
