"""The Transformer language model, shared by the supernet and the derived model (docs/design.md §2-3).

In dependency order: the two sublayer branches (:class:`CausalSelfAttention`,
:class:`FFN`, no norm inside), each wrapped by a :class:`~autoln.models.site.Site` with one or
more placements, a :class:`Block` (attention site, then FFN site), and :class:`TransformerLM`
(embeddings, blocks, final norm, tied LM head). The supernet (:mod:`autoln.models.supernet`) is a
``TransformerLM`` whose sites hold every candidate; the derived model is one whose sites hold
exactly one, so its ``state_dict`` keys are a subset of the supernet's.

Shapes: token ids ``(B, T)`` int64 with ``T <= context``; hidden states ``(B, T, d_model)``;
logits ``(B, T, vocab_size)``; losses are mean cross-entropy in nats per token.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from autoln.core import distributed
from autoln.config import ModelConfig
from autoln.models.qk_norm import QKNorm
from autoln.models.site import Site
from autoln.space.placements import NORMS, scale_residual_branch


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

    ``qk``: the QK-norm candidates of this layer (:mod:`autoln.space.qk`): ``("none",)`` gives
    no :class:`~autoln.models.qk_norm.QKNorm` module at all (the model of before, key for key),
    one other name a fixed QK-norm, several a searched one (mixed by the supernet).
    """

    def __init__(self, cfg: ModelConfig, qk: Sequence[str] = ("none",)) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.dropout = cfg.dropout
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.qk_norm = None if list(qk) == ["none"] else QKNorm(qk, d, cfg.n_heads, cfg.norm)

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

        def heads(z: torch.Tensor) -> torch.Tensor:
            return z.view(b, t, h, d // h).transpose(1, 2)

        q, k = self.q_proj(x), self.k_proj(x)
        if self.qk_norm is not None:
            q, k = self.qk_norm(q, k)
        q, k, v = heads(q), heads(k), heads(self.v_proj(x))
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


class Block(nn.Module):
    """A Transformer block: attention site, then FFN site. ``(B, T, d_model)`` in and out.

    Args:
        cfg: model dimensions.
        attn_candidates, ffn_candidates: placement names of the two sites.
        layer: the block's 1-based index.
        qk: the attention's QK-norm candidates (:class:`CausalSelfAttention`).
    """

    def __init__(self, cfg: ModelConfig, attn_candidates: Sequence[str], ffn_candidates: Sequence[str], layer: int = 1,
                 qk: Sequence[str] = ("none",)) -> None:
        super().__init__()
        self.attn = CausalSelfAttention(cfg, qk)
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
        cfg: model dimensions (``cfg.candidates``/``granularity``/``qk_norm`` are not read here).
        vocab_size: number of token ids.
        sites: per block, ``(attention candidates, FFN candidates)``; length ``cfg.n_layers``.
        qk: per block, the attention's QK-norm candidates (:mod:`autoln.space.qk`); None: none anywhere.

    Raises:
        ValueError: ``len(sites)`` or ``len(qk)`` is not ``cfg.n_layers``.
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int, sites: Sequence[tuple[Sequence[str], Sequence[str]]],
                 qk: Optional[Sequence[Sequence[str]]] = None) -> None:
        super().__init__()
        if len(sites) != cfg.n_layers:
            raise ValueError(f"got {len(sites)} block specs for n_layers={cfg.n_layers}")
        qk = [("none",)] * cfg.n_layers if qk is None else list(qk)
        if len(qk) != cfg.n_layers:
            raise ValueError(f"got {len(qk)} QK-norm choices for n_layers={cfg.n_layers}")
        self.cfg, self.vocab_size = cfg, vocab_size
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        self.drop = Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg, a, f, i + 1, q) for i, ((a, f), q) in enumerate(zip(sites, qk)))
        self.norm_f = NORMS[cfg.norm](cfg.d_model, cfg.affine != "fixed")
        self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        if cfg.output_bias == "unigram":  # added after construction: draws no random numbers, so the
            self.lm_head.bias = nn.Parameter(torch.zeros(vocab_size))  # other weights match output_bias: none
        #: dtype of the forward pass' autocast (``torch.bfloat16`` on CUDA by default; set by
        #: :func:`autoln.engine.training.prepare_model`), None for plain fp32.
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


def build_derived(cfg: ModelConfig, vocab_size: int, placements: Sequence[tuple[str, str]],
                  qk: Optional[Sequence[str]] = None) -> TransformerLM:
    """The derived (discrete) model of a genotype.

    Args:
        cfg: model dimensions; ``cfg.n_layers`` must equal ``len(placements)``.
        vocab_size: number of token ids.
        placements: per block ``(attention placement, FFN placement)``, e.g. from
            :meth:`autoln.models.genotype.Genotype.block_placements`.
        qk: per block the QK-norm choice (:meth:`autoln.models.genotype.Genotype.qk_choices`);
            None: no QK-norm.

    Raises:
        ValueError: wrong number of blocks.
    """
    return TransformerLM(cfg, vocab_size, [([a], [f]) for a, f in placements], None if qk is None else [[c] for c in qk])


def weight_param_groups(params: Sequence[tuple[str, nn.Parameter]], weight_decay: float) -> list[dict]:
    """AdamW parameter groups: decay on matrices and embeddings (``dim >= 2``), none on norm
    gains and biases (as nanoGPT). ``params``: ``(name, parameter)`` pairs."""
    decay = [p for _, p in params if p.dim() >= 2]
    no_decay = [p for _, p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
