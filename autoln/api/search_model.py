"""A user's model as a supernet: :class:`SearchModel`.

:class:`SearchModel` turns a model holding searchable sites into a supernet
(:class:`autoln.models.supernet.SupernetMixin`: alphas ``(n_sites, K)``, mixing, projection), so
the architect (:class:`autoln.oneshot.architect.Architect`), the weight step and the selections of
:mod:`autoln.oneshot.selection` run on it unchanged.

Batches are ``(x, y)`` pairs of tensors, e.g. token ids ``(B, T)`` and next-token targets
``(B, T)``; the loss is whatever ``loss_fn(model, x, y)`` returns (by default nanoGPT's
convention: ``model(x, y)`` returns ``(logits, loss)``, or logits scored by cross-entropy).
"""

from __future__ import annotations

import itertools
import sys
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from autoln.api.sites import searchable_qk_norms, searchable_sites
from autoln.models.site import Site, hold_for_backward
from autoln.models.supernet import SupernetMixin
from autoln.space.mixing import MIXINGS


LossFn = Callable[[nn.Module, torch.Tensor, Optional[torch.Tensor]], tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]


def nanogpt_loss(model: nn.Module, x: torch.Tensor, y: Optional[torch.Tensor]):
    """The default ``loss_fn``: ``model(x, y)`` as nanoGPT's ``GPT.forward(idx, targets)``. A
    model that returns ``(logits, loss)`` is taken as is; one that returns logits ``(B, T, V)``
    is scored by mean cross-entropy against ``y`` ``(B, T)`` (nats per token). Returns
    ``(logits, loss)`` (``loss`` None without ``y``)."""
    out = model(x, y) if y is not None else model(x)
    if isinstance(out, tuple):
        return out[0], out[1]
    loss = None if y is None else F.cross_entropy(out.float().reshape(-1, out.shape[-1]), y.reshape(-1))
    return out, loss


class SearchModel(SupernetMixin, nn.Module):
    """A user's model with searchable :class:`autoln.models.model.Site` s, as a supernet.

    A searched :class:`autoln.models.qk_norm.QKNorm` (``autoln.QKNorm`` with several candidates,
    called by the model's attention on ``q`` and ``k``) gets alphas of its own,
    :attr:`qk_alphas` ``(n_qk, Q)``, one row per QK-norm in module order.

    One alpha row per site, in module order (:attr:`site_names` are the sites' module names),
    or per group of sites that share one placement (``groups``, as autoln's own
    ``granularity: layer`` ties a block's attention and FFN sites; :attr:`site_names` are then
    the groups' common module prefixes); every site must offer the same candidates.
    ``forward(x, y, mix=None)`` sets each site's mixing weights (``mix`` ``(n_sites, K)`` per
    site, by default :meth:`mixing_weights`), calls ``loss_fn(model, x, y)`` and returns its
    ``(logits, loss)``.

    Args:
        model: the user's module; its parameters are the supernet's weights.
        loss_fn: ``(model, x, y) -> (logits, loss)``; default :func:`nanogpt_loss`.
        arch_init_std: alphas ``(n_rows, K)`` start as ``arch_init_std * randn`` (DARTS: 1e-3),
            drawn from torch's global generator here.
        tau: the mixing temperature (the search anneals it).
        mixing: a key of :data:`autoln.space.mixing.MIXINGS`.
        groups: lists of site module names, each sharing one alpha row; every searchable site
            in exactly one group, groups in module order of their first site. Default: each
            site its own row.

    Raises:
        ValueError: no site with two or more candidates; sites with different candidate lists;
            an unknown ``mixing``; ``groups`` that do not cover every searchable site once.
    """

    def __init__(self, model: nn.Module, loss_fn: Optional[LossFn] = None, arch_init_std: float = 1e-3, tau: float = 1.0,
                 mixing: str = "softmax", groups: Optional[Sequence[Sequence[str]]] = None) -> None:
        super().__init__()
        if mixing not in MIXINGS:
            raise ValueError(f"unknown mixing {mixing!r}; expected one of {list(MIXINGS)}")
        sites = searchable_sites(model)
        if not sites:
            if searchable_qk_norms(model):
                raise ValueError("the model's autoln.QKNorm s are searched but it holds no autoln.Site with two or more "
                                 "candidates: QK-norm is searched beside the placements, so give the sites two or more "
                                 "candidates too (e.g. ('pre', 'outnorm'))")
            raise ValueError("the model holds no autoln.Site with two or more candidates: nothing to search "
                             "(wrap each sublayer as x = self.attn_site(x, self.attn), see the README's 'Your own model')")
        cands = list(sites[0][1].placements)
        for name, site in sites:
            if list(site.placements) != cands:
                raise ValueError(f"site {name!r} offers {list(site.placements)} but {sites[0][0]!r} offers {cands}: "
                                 "every searched site needs the same candidates, in the same order")
        depths = sorted({site.n_layers for _, site in sites})
        if len(depths) > 1:
            raise ValueError(f"the sites disagree on n_layers ({depths}): pass every site the model's number of blocks N "
                             "(DeepNorm's constants and the named placements use it)")
        self.model = model
        self.loss_fn = loss_fn or nanogpt_loss
        self.sites = [s for _, s in sites]  # plain list: the sites are registered once, inside model
        #: One line each on what the sites' ``layer`` and ``n_layers`` leave doubtful (:func:`layer_notes`).
        self.layer_notes = layer_notes(sites)
        #: The searchable sites the first forward pass did not call (:meth:`forward`); None before it.
        self.unused_sites: Optional[list[str]] = None
        self._watch = [site.register_forward_pre_hook(lambda m, args: setattr(m, "_called", True)) for _, site in sites]
        #: the searchable sites' module names, in module order (one per :attr:`sites` entry)
        self.module_sites = [n for n, _ in sites]
        self.rows = site_rows(self.module_sites, groups)
        self.site_names = self.module_sites if groups is None else [group_name(g) for g in groups]
        self.candidates = cands
        self.tau, self.mixing = tau, mixing
        self.projected: dict[int, int] = {}
        self.alphas = nn.Parameter(arch_init_std * torch.randn(len(self.site_names), len(cands), device=_device(model)))
        self.init_qk(searchable_qk_norms(model), arch_init_std, _device(model))  # a searched autoln.QKNorm gets alphas of its own, after the sites'

    def arrange(self, weights: torch.Tensor) -> torch.Tensor:
        """One row per site ``(n_sites, K)``: as is, or each site's group's row."""
        if self.rows is None:
            return weights
        return weights[torch.tensor(self.rows, device=weights.device)]

    def expand(self, per_row: Sequence) -> list:
        """Per site (module order) the entry of its alpha row in ``per_row`` (one per row)."""
        return list(per_row) if self.rows is None else [per_row[r] for r in self.rows]

    def forward(self, x: torch.Tensor, y: Optional[torch.Tensor] = None, mix: Optional[torch.Tensor] = None):
        """``(logits, loss)`` of ``loss_fn`` with every site mixing by its row of ``mix``
        ``(n_sites, K)`` (default :meth:`mixing_weights`, with fresh Gumbel noise in training mode
        for stochastic mixings). Each site keeps its row for backward's recomputation of a
        block under ``torch.utils.checkpoint(..., use_reentrant=False)`` until the next forward
        pass with gradients (:func:`autoln.models.site.hold_for_backward`)."""
        mix = self.mixing_weights(self.draw_gumbel()) if mix is None else mix
        graph = torch.is_grad_enabled()  # a pass without gradients saves nothing that backward recomputes
        for site, row in zip(self.sites, mix):
            site.mix = row
            site.__dict__["_grad_forward"] = graph  # a site that meets gradients off inside this pass is checkpointed reentrantly
        try:
            with self.qk_mixing():
                return self.loss_fn(self.model, x, y)
        finally:
            for site, row in zip(self.sites, mix):
                site.mix = None
                site.__dict__.pop("_grad_forward", None)
                if graph:
                    hold_for_backward(site, row)
            if self._watch:
                self._first_pass_done()

    def _first_pass_done(self) -> None:
        """After the first forward pass: note the sites it did not call (:attr:`unused_sites`,
        one warning on stderr) and remove the hooks that watched them."""
        for hook in self._watch:
            hook.remove()
        self._watch = []
        self.unused_sites = [n for n, site in zip(self.module_sites, self.sites) if not site.__dict__.pop("_called", False)]
        for site in self.sites:
            site.__dict__.pop("_called", None)
        if self.unused_sites:
            print(f"autoln.search: warning: {unused_note(self.unused_sites)}", file=sys.stderr, flush=True)


def unused_note(names: Sequence[str]) -> str:
    """The line on searchable sites that the model's forward never calls."""
    return (f"the model's forward never calls the site(s) {list(names)}: they take no part in the loss, so their answer is "
            "their alphas' random start, not a result; call each site in forward (x = self.attn_site(x, self.attn)) or "
            "give it one candidate")


def layer_notes(sites: Sequence[tuple[str, Site]]) -> list[str]:
    """One line each on what the sites' ``layer`` and ``n_layers`` leave doubtful (the model
    cannot say how many blocks it has, so these are notes, not errors): every site at
    ``layer=1`` of several (LayerNorm Scaling's ``1/sqrt(l)`` is then 1 everywhere, and the
    named placements put every site in the first block); the sites reaching a lower layer than
    ``n_layers`` (DeepNorm's constants and init gain use ``N = n_layers``)."""
    if not sites:
        return []
    n = sites[0][1].n_layers
    layers = sorted({site.layer for _, site in sites})
    notes = []
    if n > 1 and len(sites) > 1 and layers == [1]:
        notes.append(f"every one of the {len(sites)} sites is at layer=1 of n_layers={n}: LayerNorm Scaling's 1/sqrt(l) is 1 at "
                     "every site and mix-ln and pre-post put every site in the first block; pass block i's sites layer=i + 1")
    elif layers[-1] < n:
        notes.append(f"the sites reach layer {layers[-1]} but n_layers={n}: DeepNorm's alpha = (2N)^(1/4) and init gain "
                     f"(8N)^(-1/4) use N={n}; if the model has {layers[-1]} blocks, pass n_layers={layers[-1]}")
    return notes


def site_rows(names: Sequence[str], groups: Optional[Sequence[Sequence[str]]]) -> Optional[list[int]]:
    """Per site of ``names`` the index of its group in ``groups`` (None without groups).

    Raises:
        ValueError: a site in no group or in two, a name that is no searchable site, or
            groups out of module order."""
    if groups is None:
        return None
    if isinstance(groups, str) or any(isinstance(g, str) or not hasattr(g, "__iter__") for g in groups):
        raise ValueError("groups: expected lists of site module names, e.g. [['blocks.0.attn_site', 'blocks.0.ffn_site'], ...]")
    row = {}
    for r, group in enumerate(groups):
        if not list(group):
            raise ValueError(f"groups: group {r} is empty (each group names the sites that share one placement)")
        for name in group:
            if name not in names:
                raise ValueError(f"groups: {name!r} is not a searchable site of the model (its sites: {list(names)})")
            if name in row:
                raise ValueError(f"groups: site {name!r} is in two groups")
            row[name] = r
    missing = [n for n in names if n not in row]
    if missing:
        raise ValueError(f"groups: the sites {missing} are in no group (every searchable site needs one)")
    rows = [row[n] for n in names]
    if [r for i, r in enumerate(rows) if r not in rows[:i]] != list(range(len(groups))):
        raise ValueError("groups: list the groups in the module order of their first site")
    return rows


def group_name(group: Sequence[str]) -> str:
    """A group's name: its sites' common dotted prefix (``blocks.0`` for ``blocks.0.attn_site``
    and ``blocks.0.ffn_site``), or the names joined by ``+`` when they share none."""
    parts = [n.split(".") for n in group]
    common = []
    for pieces in zip(*parts):
        if len(set(pieces)) != 1:
            break
        common.append(pieces[0])
    return ".".join(common) if common and len(group) > 1 else "+".join(group)


def _device(model: nn.Module) -> torch.device:
    return next(itertools.chain(model.parameters(), [torch.empty(0)])).device
