"""A small GPT in the style of nanoGPT's model.py (Karpathy), not autoln's own model, made
searchable: the only change is where the layer norms are applied (see ``Block``).

nanoGPT's block is Pre-LN::

    self.ln_1 = LayerNorm(config.n_embd, bias=config.bias)
    self.ln_2 = LayerNorm(config.n_embd, bias=config.bias)
    ...
    x = x + self.attn(self.ln_1(x))
    x = x + self.mlp(self.ln_2(x))

Here each sublayer is an ``autoln.Site`` that holds the norms of its placement(s) and calls the
branch: with ``norm_candidates=("pre",)`` (the default) this is nanoGPT's Pre-LN model; with
several candidates it is a supernet for ``autoln.search``; ``autoln.derive`` keeps one per site.
Shapes: token ids ``(B, T)``, ``T <= block_size``; logits ``(B, T, vocab_size)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

import autoln


@dataclass
class GPTConfig:
    block_size: int = 128
    vocab_size: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = False
    norm_candidates: tuple[str, ...] = ("pre",)  # autoln: the placements each site may take


class CausalSelfAttention(nn.Module):

    def __init__(self, config: GPTConfig):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):

    def __init__(self, config: GPTConfig, layer: int):
        super().__init__()
        # autoln: the two LayerNorms become sites (they hold the norms of their placements)
        self.attn_site = autoln.Site(config.norm_candidates, config.n_embd, config.n_layer, layer=layer)
        self.attn = CausalSelfAttention(config)
        self.mlp_site = autoln.Site(config.norm_candidates, config.n_embd, config.n_layer, layer=layer)
        self.mlp = MLP(config)

    def forward(self, x):
        x = self.attn_site(x, self.attn)  # autoln: was x = x + self.attn(self.ln_1(x))
        x = self.mlp_site(x, self.mlp)    # autoln: was x = x + self.mlp(self.ln_2(x))
        return x

    def deepnorm_weights(self, site: str) -> list[torch.Tensor]:
        """What DeepNorm's init gain scales at this block's ``attn_site`` or ``mlp_site``: the
        value third of ``c_attn`` and ``c_proj``, or both MLP layers (Wang et al. 2022)."""
        if site == "attn_site":
            return [self.attn.c_attn.weight[2 * self.attn.n_embd:], self.attn.c_proj.weight]
        return [self.mlp.c_fc.weight, self.mlp.c_proj.weight]


class GPT(nn.Module):

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config, i + 1) for i in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def deepnorm_weights(self, site_name: str) -> list[torch.Tensor]:
        """For ``autoln.derive``: the weights DeepNorm's gain scales at the site called
        ``site_name`` (``transformer.h.<i>.attn_site`` or ``...mlp_site``)."""
        *_, i, site = site_name.split(".")
        return self.transformer.h[int(i)].deepnorm_weights(site)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        assert t <= self.config.block_size, f"sequence of {t} tokens, block size is only {self.config.block_size}"
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss
