"""The Transformer language model, shared by the supernet and the derived model (docs/design.md §2-3).

In dependency order: the two sublayer branches (:class:`CausalSelfAttention`,
:class:`FFN`, no norm inside), a :class:`Site` that wraps one branch with one or more
placements, a :class:`Block` (attention site, then FFN site), and :class:`TransformerLM`
(embeddings, blocks, final norm, tied LM head). The supernet (:mod:`autoln.models.supernet`) is a
``TransformerLM`` whose sites hold every candidate; the derived model is one whose sites hold
exactly one, so its ``state_dict`` keys are a subset of the supernet's.

Shapes: token ids ``(B, T)`` int64 with ``T <= context``; hidden states ``(B, T, d_model)``;
logits ``(B, T, vocab_size)``; losses are mean cross-entropy in nats per token.
"""

from __future__ import annotations

import difflib
import math
from collections import abc
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from autoln.core import distributed
from autoln.config import ModelConfig
from autoln.space.placements import NORMS, build_placement, placement_names, scale_residual_branch


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout (Srivastava et al. 2014) of ``x`` ``(B, ...)`` whose mask is drawn for
    the *global* batch: under ``torchrun`` each of the N processes draws the keep mask of all
    ``N * B`` rows from the shared generator and applies its own block of rows (the rows
    :func:`autoln.core.distributed.shard` gave it), so an N-process run applies the masks a
    one-process run draws for the whole batch, and the generator stays in step on every process
    (the Gumbel noise drawn next is the same everywhere). Kept values are scaled by
    ``1 / (1 - p)``. Identity when not ``training`` or ``p == 0``. Returns a tensor shaped like ``x``.
    """
    if not training or p == 0.0:
        return x
    n, b = distributed.world_size(), x.shape[0]
    keep = torch.empty((n * b, *x.shape[1:]), device=x.device, dtype=x.dtype).bernoulli_(1.0 - p)
    if n > 1:
        r = distributed.rank()
        keep = keep[r * b:(r + 1) * b]
    return x * keep / (1.0 - p)


class Dropout(nn.Module):
    """:func:`dropout` as a module (a drop-in for ``nn.Dropout``: no parameters, no state)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` of any shape ``(B, ...)``; returns the same shape."""
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention via ``torch.nn.functional.scaled_dot_product_attention``.

    With attention dropout (``cfg.dropout > 0``) in training mode the attention is computed
    explicitly, ``softmax(q k^T / sqrt(d_head) + causal) -> dropout -> @ v``, so that its mask
    comes from :func:`dropout` (drawn for the global batch, replayable by the bilevel step)
    rather than from inside SDPA's kernel; the result is the same function.

    Separate query, key, value and output projections (no bias), so that DeepNorm's init gain
    can land on the value and output projections only. Input and output ``(B, T, d_model)``.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def residual_path_weights(self) -> list[nn.Parameter]:
        """The matrices DeepNorm's init gain ``b`` scales: value and output projections."""
        return [self.v_proj.weight, self.o_proj.weight]

    def output_projections(self) -> list[nn.Parameter]:
        """The matrix that writes into the residual stream (GPT-2's scaled ``c_proj``): the output projection."""
        return [self.o_proj.weight]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, d_model)`` -> ``(B, T, d_model)``; position ``t`` attends to ``<= t``."""
        b, t, d = x.shape
        h = self.n_heads

        def heads(proj: nn.Linear) -> torch.Tensor:
            return proj(x).view(b, t, h, d // h).transpose(1, 2)

        q, k, v = heads(self.q_proj), heads(self.k_proj), heads(self.v_proj)
        if self.training and self.dropout > 0:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(d // h))
            future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            att = dropout(att.masked_fill(future, float("-inf")).softmax(-1), self.dropout, True)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, d))


class FFN(nn.Module):
    """Position-wise feed-forward branch ``fc2(GELU(fc1(x)))`` (no bias), ``(B, T, d_model)`` in and out."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.fc2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)
        self.drop = Dropout(cfg.dropout)

    def residual_path_weights(self) -> list[nn.Parameter]:
        """The matrices DeepNorm's init gain ``b`` scales: both FFN projections."""
        return [self.fc1.weight, self.fc2.weight]

    def output_projections(self) -> list[nn.Parameter]:
        """The matrix that writes into the residual stream (GPT-2's scaled ``c_proj``): ``fc2``."""
        return [self.fc2.weight]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, T, d_model)`` -> ``(B, T, d_model)``."""
        return self.drop(self.fc2(F.gelu(self.fc1(x))))


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

        Raises:
            ValueError: several candidates and no mixing weights (a searched site used outside
                :class:`autoln.api.SearchModel`, or not derived).
        """
        placements = list(self.placements.values())
        if len(placements) == 1:
            return placements[0].output(x, self.call_branch(branch, placements[0].branch_input(x)))
        weights = self.mix if weights is None else weights
        if weights is None:
            raise ValueError(f"a site with several candidates ({list(self.placements)}) needs mixing weights: run the model "
                             "inside autoln.SearchModel, or autoln.derive it to one placement first")
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
    by the site's module name. The model's mode is restored."""
    sites = {n: m for n, m in model.named_modules() if isinstance(m, Site) and len(m.placements) > 1}
    was_training = model.training
    model.eval()
    for site in sites.values():
        site.probe = []
    try:
        forward(x)
        return {n: site.probe[0] for n, site in sites.items() if site.probe}
    finally:
        for site in sites.values():
            site.probe = None
        model.train(was_training)


class Block(nn.Module):
    """A Transformer block: attention site, then FFN site. ``(B, T, d_model)`` in and out.

    Args:
        cfg: model dimensions.
        attn_candidates, ffn_candidates: placement names of the two sites.
    """

    def __init__(self, cfg: ModelConfig, attn_candidates: Sequence[str], ffn_candidates: Sequence[str], layer: int = 1) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(cfg)
        self.ffn = FFN(cfg)
        self.attn_site = Site(attn_candidates, cfg.d_model, cfg.n_layers, cfg.norm, layer)
        self.ffn_site = Site(ffn_candidates, cfg.d_model, cfg.n_layers, cfg.norm, layer)

    def forward(self, x: torch.Tensor, mix: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``mix``: ``(2, K)`` mixing weights of the attention and FFN sites, or None (derived)."""
        x = self.attn_site(x, self.attn, None if mix is None else mix[0])
        return self.ffn_site(x, self.ffn, None if mix is None else mix[1])


class TransformerLM(nn.Module):
    """Decoder-only language model: token + learned position embeddings, ``n_layers`` blocks,
    a final norm (docs/design.md §2: every model ends with one), and an LM head tied to the token
    embedding, with a bias when ``cfg.output_bias == "unigram"`` (zeros until
    :meth:`init_output_bias` sets it to the training split's log unigram frequencies).

    Initialisation (docs/design.md §9, docs/search.md, *A fair start for every placement*):
    embeddings ``N(0, 0.02)``; every linear ``xavier_normal_`` (gain 1); then each branch
    starts as its site's placement says (:meth:`autoln.space.placements.Placement.init_branch`):
    with ``cfg.residual_init == "scaled"`` (the default) the output projections (attention
    ``o_proj``, FFN ``fc2``) times GPT-2's ``1/sqrt(2N)`` (Radford et al. 2019, §2.3), for
    every placement and at every supernet site (several candidates share one branch); a
    derived DeepNorm site instead takes DeepNorm's own gain ``b`` on value, output, fc1 and fc2
    (Wang et al. 2022; Transformer-Clinic's ``xavier_normal_(gain=b)``, as torchscale).
    ``unscaled`` leaves every branch at plain xavier (the start before GPT-2's scaling).

    Args:
        cfg: model dimensions (``cfg.candidates``/``granularity`` are not read here).
        vocab_size: number of token ids.
        sites: per block, ``(attention candidates, FFN candidates)``; length ``cfg.n_layers``.

    Raises:
        ValueError: ``len(sites) != cfg.n_layers``.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int, sites: Sequence[tuple[Sequence[str], Sequence[str]]]) -> None:
        super().__init__()
        if len(sites) != cfg.n_layers:
            raise ValueError(f"got {len(sites)} block specs for n_layers={cfg.n_layers}")
        self.cfg, self.vocab_size = cfg, vocab_size
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, a, f, i + 1) for i, (a, f) in enumerate(sites))
        self.norm_f = NORMS[cfg.norm](cfg.d_model, cfg.affine != "fixed")
        self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        if cfg.output_bias == "unigram":  # added after construction: draws no random numbers, so the
            self.lm_head.bias = nn.Parameter(torch.zeros(vocab_size))  # other weights match output_bias: none
        #: dtype of the forward pass' autocast (``torch.bfloat16`` on CUDA by default; set by
        #: :func:`autoln.runs.training.prepare_model`), None for plain fp32.
        self.autocast_dtype: Optional[torch.dtype] = None
        self._init_weights()

    def _init_weights(self) -> None:
        with torch.no_grad():
            nn.init.normal_(self.tok_emb.weight, std=0.02)
            nn.init.normal_(self.pos_emb.weight, std=0.02)
            for module in self.blocks.modules():
                if isinstance(module, nn.Linear):
                    nn.init.xavier_normal_(module.weight)
            for block in self.blocks:
                for branch, site in ((block.attn, block.attn_site), (block.ffn, block.ffn_site)):
                    if len(site.placements) == 1:
                        next(iter(site.placements.values())).init_branch(branch, self.cfg.residual_init)
                    else:
                        scale_residual_branch(branch, self.cfg.n_layers, self.cfg.residual_init)

    def init_output_bias(self, log_probs) -> "TransformerLM":
        """Start the LM head's bias at ``log_probs`` ``(vocab_size,)`` (float, natural log), the
        training split's unigram log-probabilities (:meth:`autoln.data.Corpus.unigram_log_probs`):
        at initialisation the logits are then the unigram log-probabilities plus a small
        ``LN(x) @ E^T`` term, for every placement alike (Lin et al. 2017, "Focal Loss", §3.3:
        initialise the output bias to the prior). Draws no random numbers. A no-op with
        ``model.output_bias: none``. Returns the model.

        Raises:
            ValueError: ``log_probs`` is not of shape ``(vocab_size,)`` or not finite.
        """
        if self.lm_head.bias is None:
            return self
        prior = torch.as_tensor(log_probs, dtype=torch.float32)
        if prior.shape != (self.vocab_size,) or not bool(torch.isfinite(prior).all()):
            raise ValueError(f"output bias: expected {self.vocab_size} finite log-probabilities, got shape {tuple(prior.shape)}")
        with torch.no_grad():
            self.lm_head.bias.copy_(prior.to(self.lm_head.bias.device))
        return self

    def hidden_states(self, idx: torch.Tensor, mix: Optional[torch.Tensor] = None) -> list[torch.Tensor]:
        """Residual stream after the embedding and after each block: ``n_layers + 1`` tensors
        of shape ``(B, T, d_model)`` (before the final norm). ``mix``: ``(n_layers, 2, K)``."""
        t = idx.shape[1]
        if t > self.cfg.context:
            raise ValueError(f"sequence length {t} exceeds model.context={self.cfg.context}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        states = [x]
        for i, block in enumerate(self.blocks):
            x = block(x, None if mix is None else mix[i])
            states.append(x)
        return states

    def forward(self, idx: torch.Tensor, targets: Optional[torch.Tensor] = None, mix: Optional[torch.Tensor] = None):
        """Args: ``idx`` ``(B, T)`` token ids; ``targets`` ``(B, T)`` next-token ids or None;
        ``mix`` ``(n_layers, 2, K)`` supernet mixing weights or None.

        Returns ``(logits (B, T, V), loss)`` with ``loss`` the mean cross-entropy in nats per
        token (None without targets), computed in fp32 even under autocast (the logits are
        then bf16)."""
        dtype = self.autocast_dtype
        with torch.autocast(idx.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            x = self.hidden_states(idx, mix)[-1]
            logits = self.lm_head(self.norm_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss


@contextmanager
def full_precision(model: TransformerLM) -> Iterator[None]:
    """Run ``model``'s forward passes in fp32 inside the block, whatever its autocast dtype:
    for computations that difference nearby values (the second-order finite difference, the
    alpha Hessian), where bf16's 8-bit mantissa would drown the signal."""
    saved, model.autocast_dtype = model.autocast_dtype, None
    try:
        yield
    finally:
        model.autocast_dtype = saved


def build_derived(cfg: ModelConfig, vocab_size: int, placements: Sequence[tuple[str, str]]) -> TransformerLM:
    """The derived (discrete) model of a genotype.

    Args:
        cfg: model dimensions; ``cfg.n_layers`` must equal ``len(placements)``.
        vocab_size: number of token ids.
        placements: per block ``(attention placement, FFN placement)``, e.g. from
            :meth:`autoln.models.genotype.Genotype.block_placements`.

    Raises:
        ValueError: wrong number of blocks.
    """
    return TransformerLM(cfg, vocab_size, [([a], [f]) for a, f in placements])


def weight_param_groups(params: Sequence[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """AdamW parameter groups: decay on matrices and embeddings (``dim >= 2``), none on norm
    gains and biases (as nanoGPT). ``params``: ``(name, parameter)`` pairs."""
    decay = [p for _, p in params if p.dim() >= 2]
    no_decay = [p for _, p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
