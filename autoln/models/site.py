"""A norm site: one sublayer branch wrapped by one or several candidate placements (docs/design.md §3).

:class:`Site` is the derived model's sublayer with one candidate and the supernet's mixed
sublayer with several; it is also the public face for a user's own model (``autoln.Site``).
With it, the candidates' output scales: :func:`common_scale_mix` (the ``common`` scale of
``model.candidate_scale``), :func:`output_scales` and :func:`candidate_scales` (the RMS of each
candidate's output, for the search's diagnostics).

Shapes: hidden states ``(B, T, d_model)``; mixing weights ``(K,)`` over a site's candidates.
"""

from __future__ import annotations

import difflib
import weakref
from collections import abc
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn

from autoln.core.modes import eval_mode
from autoln.space.placements import NORMS, build_placement, placement_names

#: Each searched site's mixing weights of the last :class:`autoln.api.SearchModel` forward pass,
#: held after it returns for backward's recomputation of a block under ``torch.utils.checkpoint``
#: (:func:`hold_for_backward`); outside the module, so that a copy or a pickle of the model does
#: not carry a tensor of the autograd graph.
_HELD: "weakref.WeakKeyDictionary[nn.Module, torch.Tensor]" = weakref.WeakKeyDictionary()


def hold_for_backward(site: nn.Module, weights: Optional[torch.Tensor]) -> None:
    """Keep ``weights`` ``(K,)`` (or drop them, None) as ``site``'s mixing weights for backward's
    recomputation of its block (activation checkpointing, ``use_reentrant=False``): the backward
    pass reruns the block's forward after :class:`autoln.api.SearchModel` has cleared
    :attr:`Site.mix`, and the rerun must mix as the forward pass did."""
    if weights is None:
        _HELD.pop(site, None)
    else:
        _HELD[site] = weights


def in_backward() -> bool:
    """True while autograd's engine runs a backward pass in this thread (where
    ``torch.utils.checkpoint`` recomputes a block)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def check_site_args(candidates: Sequence[str], d_model: int, n_layers: int, layer: int, norm: str = "layernorm") -> None:
    """Refuse :class:`Site` arguments that would fail later without naming themselves (e.g.
    ``layer=0`` from ``enumerate`` with ``lns``: ``0.0 cannot be raised to a negative power``).

    Raises:
        ValueError: one line naming the argument and what was expected."""
    def whole(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    if isinstance(candidates, str) or not isinstance(candidates, abc.Sequence) or not len(candidates):
        raise ValueError(f"autoln.Site: candidates: expected a list of placement names such as ['pre', 'post', 'deepnorm'], "
                         f"got {candidates!r}")
    names = placement_names()
    for c in candidates:
        if c not in names:
            close = difflib.get_close_matches(str(c), names, n=1)
            raise ValueError(f"autoln.Site: candidates: {c!r} is not a placement" + (f" (did you mean {close[0]!r}?)" if close else "")
                             + f"; expected names of {names}")
    twice = sorted({c for c in candidates if list(candidates).count(c) > 1})
    if twice:
        raise ValueError(f"autoln.Site: candidates: {', '.join(map(repr, twice))} given twice in {list(candidates)}: each "
                         "candidate once (the mixing weights have one entry per candidate)")
    for name, v in (("d_model", d_model), ("n_layers", n_layers)):
        if not whole(v) or v < 1:
            raise ValueError(f"autoln.Site: {name}: expected a positive integer, got {v!r}")
    if not whole(layer) or not 1 <= layer <= n_layers:
        hint = " (block i of enumerate is layer=i + 1)" if layer == 0 else ""
        raise ValueError(f"autoln.Site: layer: expected the 1-based block index, 1..n_layers={n_layers}, got {layer!r}{hint}")
    if norm not in NORMS:
        raise ValueError(f"autoln.Site: norm: expected one of {list(NORMS)}, got {norm!r}")


class Site(nn.Module):
    """One sublayer site: a branch wrapped by one or several candidate placements (docs/design.md §3).

    With one candidate it is the derived model's sublayer. With several it is the supernet's
    mixed sublayer ``sum_k w_k * y_k(x)``, evaluating the branch once per *distinct branch
    input* (the cost floor), not once per candidate:

    - candidates fed the raw stream ``x`` (``post``, ``deepnorm``, ``outnorm``, ``none``) share
      one call ``F(x)``;
    - candidates fed ``LN_in(x)`` (``pre``, ``peri``) share one input norm module per gain
      form (learnable, or fixed), and so one call ``F(LN_in(x))`` per form. Sharing the input
      norm is the same weight sharing as sharing the branch: a one-hot supernet still equals
      the derived model exactly, whose ``pre`` or ``peri`` carries that norm;
    - ``lns`` feeds ``LN(x) / sqrt(l)``, a call of its own.

    So ``pre, post, deepnorm`` cost two calls, and all seven placements three. The weighted sum
    is accumulated by :meth:`autoln.space.placements.Placement.mix_into`. (Separate calls, not one
    call on the inputs stacked along the batch: equally fast on CPU, without the copy.)

    The public face of autoln for a user's own model (README, *Your own model*): a block's
    ``x = x + self.attn(self.ln_1(x))`` becomes ``x = self.attn_site(x, self.attn)`` with
    ``self.attn_site = autoln.Site(["pre", "post", "deepnorm"], d_model, n_layers, layer=i + 1)``.
    Inside :class:`autoln.api.SearchModel` the site mixes its candidates with the weights the
    search sets (:attr:`mix`); after :func:`autoln.api.derive` it holds one placement.

    Args:
        candidates: placement names (``pre``, ``pre:fixed``, ...), in the order of the mixing weights.
        d_model, n_layers, norm: passed to each placement (``n_layers``: the model's number of
            blocks ``N``, for DeepNorm's constants; ``norm``: a key of
            :data:`autoln.space.placements.NORMS`).
        layer: 1-based index of the block, ``1..n_layers`` (LayerNorm Scaling's ``l``): block
            ``i`` of ``enumerate`` is ``layer=i + 1``.
        bias: the norms carry a learnable bias (True, as ``nn.LayerNorm``) or none (False, as
            nanoGPT's ``LayerNorm(..., bias=config.bias)`` with ``bias=False``); pass the
            model's own choice so that ``("pre",)`` is its unchanged block.

    Raises:
        ValueError: one line naming the argument: no candidates, an unknown or repeated
            candidate name, ``d_model`` or ``n_layers`` not a positive integer, ``layer``
            outside ``1..n_layers`` (it is 1-based), an unknown ``norm``.
    """

    def __init__(self, candidates: Sequence[str], d_model: int, n_layers: int, norm: str = "layernorm", layer: int = 1,
                 bias: bool = True) -> None:
        super().__init__()
        check_site_args(candidates, d_model, n_layers, layer, norm)
        self.layer, self.n_layers = layer, n_layers  # the block (1-based) and the depth: Mix-LN's named placements
        self.placements = nn.ModuleDict({n: build_placement(n, d_model, n_layers, norm, layer, bias) for n in candidates})
        #: The mixing weights ``(K,)`` of the current forward pass when the site is searched inside
        #: :class:`autoln.api.SearchModel` (which sets and clears it); None otherwise.
        self.mix: Optional[torch.Tensor] = None
        #: While a list (:func:`candidate_scales` sets and clears it), each mixed forward appends
        #: every candidate's output RMS and its share of the mixture.
        self.probe: Optional[list] = None
        #: ``search.candidate_scale``: ``raw`` mixes the candidates' outputs as they are; ``common``
        #: brings each to the mixture's common RMS first (:func:`common_scale_mix`). Set by the supernet.
        self.candidate_scale = "raw"
        #: The site's module name in its model, for error messages (set by :class:`autoln.api.SearchModel`
        #: and :func:`autoln.api.derive`); None before.
        self.name: Optional[str] = None
        shared: dict[bool, nn.Module] = {}
        for p in self.placements.values():
            if p.input == "norm":  # pre and peri of one gain form share LN_in (see above)
                p.norm = shared.setdefault(p.affine, p.norm)

    def call_branch(self, branch: Callable, h: torch.Tensor) -> torch.Tensor:
        """``branch(h)``, checked: one tensor shaped as ``h`` ``(B, T, d_model)``.

        Raises:
            TypeError: naming the site (:attr:`name`) and the branch: it returned something
                else, e.g. a Hugging Face ``(out, attn_weights)`` tuple, or another shape."""
        out = branch(h)
        if isinstance(out, torch.Tensor) and out.shape == h.shape:
            return out
        where = f"autoln.Site {self.name!r}" if self.name else "autoln.Site"
        what = type(branch).__name__
        if isinstance(out, (tuple, list)):
            raise TypeError(f"{where}: its branch {what} returned a {type(out).__name__} of {len(out)}, expected one tensor shaped "
                            f"as its input {tuple(h.shape)}; for a branch that returns (out, attn_weights), as Hugging Face "
                            "attention does, pass a module or function that returns its first element, e.g. lambda h: attn(h)[0]")
        got = f"shape {tuple(out.shape)}" if isinstance(out, torch.Tensor) else f"a {type(out).__name__}"
        raise TypeError(f"{where}: its branch {what} returned {got}, expected one tensor shaped as its input {tuple(h.shape)} "
                        "(a sublayer maps (B, T, d_model) to itself)")

    def input_groups(self) -> list[list[int]]:
        """Candidate indices grouped by branch input, one group per call of the branch."""
        groups: dict[object, list[int]] = {}
        for k, p in enumerate(self.placements.values()):
            key = "raw" if p.input == "raw" else id(p.norm) if p.input == "norm" else id(p)
            groups.setdefault(key, []).append(k)
        return list(groups.values())

    def forward(self, x: torch.Tensor, branch: nn.Module, weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Args: ``x`` ``(B, T, d_model)``; ``branch`` the shared sublayer (any module mapping
        ``(B, T, d_model)`` to itself); ``weights`` ``(K,)`` mixing weights over the candidates
        (when there are several: given, or set in :attr:`mix` by the search; ignored with one).
        Returns ``(B, T, d_model)``.

        A block under ``torch.utils.checkpoint(..., use_reentrant=False)`` works: when backward
        reruns it, the site mixes with the weights of the forward pass that built the graph
        (:func:`hold_for_backward`), so the gradients are those without checkpointing.

        Raises:
            ValueError: several candidates and no mixing weights (a searched site used outside
                :class:`autoln.api.SearchModel`, or not derived); mixing weights that carry a
                gradient met with gradients off inside a :class:`autoln.api.SearchModel` pass
                that has them on (a ``torch.utils.checkpoint`` with ``use_reentrant=True``, or
                ``torch.no_grad`` inside the model's forward), where the alphas would get none.
        """
        placements = list(self.placements.values())
        if len(placements) == 1:
            return placements[0].output(x, self.call_branch(branch, placements[0].branch_input(x)))
        weights = self.mix if weights is None else weights
        if weights is None and in_backward():
            weights = _HELD.get(self)
        if weights is None:
            raise ValueError(f"a site with several candidates ({list(self.placements)}) needs mixing weights: run the model "
                             "inside autoln.SearchModel, or autoln.derive it to one placement first")
        if weights.requires_grad and not torch.is_grad_enabled() and self.__dict__.get("_grad_forward"):
            where = f"autoln.Site {self.name!r}" if self.name else "autoln.Site"
            raise ValueError(f"{where} runs with gradients off inside a search's forward pass (torch.utils.checkpoint with "
                             "use_reentrant=True, or torch.no_grad in the model), so the alphas would get no gradient: "
                             "use torch.utils.checkpoint(..., use_reentrant=False), which the search supports")
        fx = [None] * len(placements)
        for group in self.input_groups():
            out = self.call_branch(branch, placements[group[0]].branch_input(x))
            for k in group:
                fx[k] = out
        if self.probe is not None:
            self.probe.append(output_scales(list(self.placements), [p.output(x, fx[k]) for k, p in enumerate(placements)],
                                            weights))
        if self.candidate_scale == "common":
            return common_scale_mix([p.output(x, fx[k]) for k, p in enumerate(placements)], weights)
        acc = None
        # norm-ending candidates first: they start the sum, the others join it with addcmul
        for k in sorted(range(len(placements)), key=lambda k: not placements[k].ends_in_norm):
            acc = placements[k].mix_into(acc, x, fx[k], weights[k])
        return acc


#: Values of ``search.candidate_scale`` (:class:`Site`).
CANDIDATE_SCALES = ("raw", "common")


def common_scale_mix(outputs: Sequence[torch.Tensor], weights: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """The mixture with every candidate's output brought to one scale first (the variant
    "one scale" of docs/results.md; the analogue of DARTS' affine-free BatchNorm at each operation's output,
    quark0/darts ``cnn/model_search.py``): per token, ``y_k`` is multiplied by ``s_k = r / r_k``,
    ``r_k`` its RMS over ``d_model`` and ``r = sum_k w_k r_k / sum_k w_k`` the mixture's weighted
    RMS, both detached, so the scale sets the regime and not the gradient; the result is
    ``sum_k w_k s_k y_k``. With one-hot weights ``s_k = 1`` for the chosen candidate and the
    others weigh 0: the derived model's output (docs/design.md §3, the one-hot equivalence).

    Args:
        outputs: the K candidates' outputs, each ``(B, T, d_model)``.
        weights: their mixing weights ``(K,)``.
    Returns:
        ``(B, T, d_model)``."""
    with torch.no_grad():
        rms = [y.float().pow(2).mean(-1, keepdim=True).sqrt().clamp_min(eps) for y in outputs]
        w = weights.detach().float()
        common = sum(wk * r for wk, r in zip(w, rms)) / w.sum().clamp_min(eps)
        scales = [(common / r).to(y.dtype) for r, y in zip(rms, outputs)]
    acc = None
    for wk, s, y in zip(weights, scales, outputs):
        term = wk * (s * y)
        acc = term if acc is None else acc + term
    return acc


@torch.no_grad()
def output_scales(names: Sequence[str], outputs: Sequence[torch.Tensor], weights: torch.Tensor) -> dict:
    """Each candidate's output RMS (over every element of its ``(B, T, d_model)`` output) and its
    share of the mixture, ``|w_k| rms_k / sum_j |w_j| rms_j`` (at nanoGPT's start the
    normed candidates' outputs, RMS 1, outweigh Pre-LN's stream, RMS 0.03, 35 to 1).
    Returns ``{"rms": {name: float}, "share": {name: float}}``."""
    rms = [float(y.float().pow(2).mean().sqrt()) for y in outputs]
    mag = [abs(float(w)) * r for w, r in zip(weights, rms)]
    total = sum(mag) or 1.0
    return {"rms": dict(zip(names, rms)), "share": {n: m / total for n, m in zip(names, mag)}}


@torch.no_grad()
def candidate_scales(model: nn.Module, x: torch.Tensor, forward: Callable[[torch.Tensor], Any]) -> dict[str, dict]:
    """Every searched site's candidate output RMS and share of the mixture (:func:`output_scales`)
    in one forward pass ``forward(x)`` of ``model`` in eval mode (``x``: token ids ``(B, T)``),
    by the site's module name. Each module's mode is restored (:func:`autoln.core.modes.eval_mode`)."""
    sites = {n: m for n, m in model.named_modules() if isinstance(m, Site) and len(m.placements) > 1}
    for site in sites.values():
        site.probe = []
    try:
        with eval_mode(model):
            forward(x)
        return {n: site.probe[0] for n, site in sites.items() if site.probe}
    finally:
        for site in sites.values():
            site.probe = None
