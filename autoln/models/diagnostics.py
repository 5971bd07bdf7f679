"""The diagnostics the layer-norm papers use to explain stability (docs/design.md §7), for a derived
model (:class:`autoln.models.model.TransformerLM`) on one fixed batch.

- :func:`grad_norms`: per block, the gradient's Frobenius norm of the attention out-projection
  (``attn.o_proj.weight``) and the FFN's second weight (``ffn.fc2.weight``); at initialisation
  Post-LN's grow toward the output, Pre-LN's stay flat (Xiong et al. 2020, Fig. 3).
- :func:`residual_norms`: mean L2 norm of the residual stream after the embedding and after
  each block; Pre-LN's grows with depth, Post-LN's stays near ``sqrt(d)`` (Xiong et al. 2020,
  Lemma 2).
- :func:`angular_distances`: per block, ``arccos(cos(x_in, x_out)) / pi`` averaged over tokens:
  0 when a block leaves its input's direction unchanged, 0.5 when its output is orthogonal to
  it (Li et al. 2024, Mix-LN, after Gromov et al. 2024).
- :func:`update_size`: ``mean_t ||f(x; theta_t) - f(x; theta_0)||_2`` over tokens, ``f`` the
  logits; Post-LN's early updates blow up, DeepNorm bounds them (Wang et al. 2022, Fig. 4-5).
- :func:`output_change`: how far one Adam-like first step (``lr * sign(grad)``) moves the
  final hidden state, relative to its size: Admin's output-change measure of how strongly a
  stack amplifies small parameter changes (Liu et al. 2020, "Understanding the Difficulty of
  Training Transformers", §4); large for deep Post-LN stacks, which then stall.
- :class:`SpikeCounter`: steps whose loss exceeds ``factor`` times the running mean.

All take a batch ``x`` of token ids ``(B, T)`` (and ``y`` targets ``(B, T)`` for gradients) and
return plain Python floats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from autoln.models.model import TransformerLM


def angular_distance(x_in: torch.Tensor, x_out: torch.Tensor) -> float:
    """Mean over tokens of ``arccos(cos(x_in, x_out)) / pi`` in [0, 1].

    Args:
        x_in, x_out: ``(..., d)`` tensors of the same shape.
    Raises:
        ValueError: shapes differ.
    """
    if x_in.shape != x_out.shape:
        raise ValueError(f"angular_distance: shapes differ, {tuple(x_in.shape)} vs {tuple(x_out.shape)}")
    cos = torch.nn.functional.cosine_similarity(x_in.double(), x_out.double(), dim=-1, eps=1e-12)
    return float((torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi).mean())


@torch.no_grad()
def residual_norms(model: TransformerLM, x: torch.Tensor) -> list[float]:
    """``n_layers + 1`` values: mean over tokens of the residual stream's L2 norm after the
    embedding (index 0) and after each block (index ``l``), before the final norm."""
    return [float(h.double().norm(dim=-1).mean()) for h in model.hidden_states(x)]


@torch.no_grad()
def angular_distances(model: TransformerLM, x: torch.Tensor) -> list[float]:
    """``n_layers`` values: :func:`angular_distance` between each block's input and output."""
    states = model.hidden_states(x)
    return [angular_distance(a, b) for a, b in zip(states[:-1], states[1:])]


def grad_norms(model: TransformerLM, x: torch.Tensor, y: torch.Tensor) -> dict[str, list[float]]:
    """Per block, the gradient norms of the mean cross-entropy on ``(x, y)`` with respect to
    ``attn.o_proj.weight`` (key ``attn_out``) and ``ffn.fc2.weight`` (key ``ffn_out``). The
    model's existing gradients are left untouched."""
    params = [p for b in model.blocks for p in (b.attn.o_proj.weight, b.ffn.fc2.weight)]
    _, loss = model(x, y)
    grads = torch.autograd.grad(loss, params)
    norms = [float(g.double().norm()) for g in grads]
    return {"attn_out": norms[0::2], "ffn_out": norms[1::2]}


@torch.no_grad()
def logits(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's logits ``(B, T, V)`` on ``x`` in eval mode (the reference for
    :func:`update_size`)."""
    was = model.training
    model.eval()
    out = model(x)[0].double()
    model.train(was)
    return out


def update_size(model: nn.Module, x: torch.Tensor, reference: torch.Tensor) -> float:
    """``mean over tokens of ||f(x; theta) - reference||_2`` with ``reference`` =
    :func:`logits` of the initial model on the same ``x``."""
    return float((logits(model, x) - reference).norm(dim=-1).mean())


def output_change(model: TransformerLM, x: torch.Tensor, y: torch.Tensor, lr: float) -> float:
    """Relative change of the final hidden state (the final norm's output, which the LM head
    reads) ``(B, T, d_model)`` after one step ``theta - lr * sign(grad)`` of every weight (Adam's
    first step is ``lr * sign(grad)``; a supernet's alphas are left alone):
    ``mean_t ||h'_t - h_t||_2 / mean_t ||h_t||_2``. Liu et al. 2020 (Admin), §4: the output
    change a small update causes, which grows with depth for Post-LN. A supernet mixes with
    its deterministic relaxed weights. Eval mode; the model's weights and gradients are
    restored. ``lr`` in the weights' units (e.g. the first warm-up step's, ``lr /
    warmup_steps``).

    Raises:
        ValueError: ``lr`` negative.
    """
    if lr < 0:
        raise ValueError(f"output_change: lr must be non-negative, got {lr}")
    arch = {id(p) for p in getattr(model, "arch_parameters", lambda: [])()}
    params = [p for p in model.parameters() if p.requires_grad and id(p) not in arch]
    was = model.training
    model.eval()
    try:
        def final_state() -> torch.Tensor:
            return model.norm_f(model.hidden_states(x)[-1]).double()

        _, loss = model(x, y)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        with torch.no_grad():
            before = final_state()
            saved = [p.detach().clone() for p in params]
            for p, g in zip(params, grads):
                if g is not None:
                    p.sub_(lr * g.sign())
            after = final_state()
            for p, old in zip(params, saved):
                p.copy_(old)
    finally:
        model.train(was)
    return float((after - before).norm(dim=-1).mean() / before.norm(dim=-1).mean())


@dataclass
class SpikeCounter:
    """Counts loss spikes: a step whose loss exceeds ``factor`` times the running mean (an
    exponential moving average with ``decay``, over the steps before it). The first
    ``warmup`` steps only build the mean. Non-finite losses count as spikes.

    Raises:
        ValueError: ``factor`` <= 1 or ``decay`` outside (0, 1).
    """

    factor: float = 1.5
    decay: float = 0.9
    warmup: int = 10
    mean: float = field(default=float("nan"))
    steps: int = 0
    spikes: int = 0

    def __post_init__(self) -> None:
        if not self.factor > 1.0 or not 0.0 < self.decay < 1.0:
            raise ValueError(f"SpikeCounter needs factor > 1 and 0 < decay < 1, got {self.factor}, {self.decay}")

    def update(self, loss: float) -> bool:
        """Record one step's loss; True when it is a spike."""
        self.steps += 1
        if not math.isfinite(loss):
            self.spikes += 1
            return True
        spike = self.steps > self.warmup and loss > self.factor * self.mean
        self.spikes += spike
        self.mean = loss if math.isnan(self.mean) else self.decay * self.mean + (1 - self.decay) * loss
        return spike


def snapshot(model: TransformerLM, x: torch.Tensor, y: torch.Tensor | None = None,
             reference: torch.Tensor | None = None) -> dict[str, list[float] | float]:
    """The diagnostics of ``model`` on one batch, computed in eval mode (no dropout, so no
    random numbers are drawn and training is unchanged): ``residual_norm`` and
    ``angular_distance`` per block, plus ``grad_norm_attn_out``/``grad_norm_ffn_out`` when
    targets ``y`` are given and ``update_size`` when ``reference`` logits are given."""
    was = model.training
    model.eval()
    try:
        out: dict[str, list[float] | float] = {"residual_norm": residual_norms(model, x),
                                               "angular_distance": angular_distances(model, x)}
        if y is not None:
            g = grad_norms(model, x, y)
            out["grad_norm_attn_out"], out["grad_norm_ffn_out"] = g["attn_out"], g["ffn_out"]
        if reference is not None:
            out["update_size"] = update_size(model, x, reference)
    finally:
        model.train(was)
    return out
