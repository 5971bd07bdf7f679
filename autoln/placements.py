"""The search space: where a sublayer's norm goes (DESIGN §2).

A *placement* wraps a sublayer branch ``F`` (causal self-attention or FFN) with its norms and
residual connection. Each placement is one class registered in :data:`PLACEMENTS`; adding a
candidate is one class and one registry line. A placement declares

- ``branch_input(x)``: what ``F`` is fed (``LN(x)`` for Pre-LN, ``x`` itself for Post-LN and
  DeepNorm; placements with ``raw_input = True`` feed ``x`` and so share one call of ``F``);
- ``output(x, fx)``: how ``F``'s output joins the residual stream;
- ``init_gain(n_layers)``: the gain the *derived* model applies to the branch's value, output
  and FFN weights at initialisation (1 for all but DeepNorm);
- ``mix_into(acc, x, fx, w)``: ``acc + w * output(x, fx)``, one term of the supernet's
  mixture. Placements that end in a norm (``ends_in_norm``) fold ``w`` into the norm's gain and
  bias (``w * LN_{g,b}(z) = LN_{w g, w b}(z)``); the others use one fused ``addcmul``. Either
  way one full-size operation per candidate and site is saved.

All tensors are ``(batch, time, d_model)`` floats.
"""

from __future__ import annotations

import abc
from typing import Callable, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import nn

#: Norm types by config name (``model.norm``). Each is built as ``NORMS[name](d_model)``.
NORMS: dict[str, Callable[[int], nn.Module]] = {
    "layernorm": lambda d: nn.LayerNorm(d),
    "rmsnorm": lambda d: nn.RMSNorm(d),
}


def scaled_norm(norm: nn.Module, z: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``scale * norm(z)`` computed as one norm whose elementwise gain and bias are multiplied
    by ``scale`` (a scalar tensor): equal up to rounding, one full-size ``(B, T, d_model)``
    operation fewer. ``norm``: an :class:`torch.nn.LayerNorm` or :class:`torch.nn.RMSNorm`
    built by :data:`NORMS`.

    Raises:
        TypeError: another norm type.
    """
    if isinstance(norm, nn.LayerNorm):
        weight = None if norm.weight is None else norm.weight * scale
        bias = None if norm.bias is None else norm.bias * scale
        if weight is None:
            return scale * F.layer_norm(z, norm.normalized_shape, None, bias, norm.eps)
        return F.layer_norm(z, norm.normalized_shape, weight, bias, norm.eps)
    if isinstance(norm, nn.RMSNorm):
        if norm.weight is None:
            return scale * norm(z)
        return F.rms_norm(z, norm.normalized_shape, norm.weight * scale, norm.eps)
    raise TypeError(f"scaled_norm: unsupported norm {type(norm).__name__}")


def deepnorm_constants(n_layers: int, architecture: str = "decoder", n_decoder_layers: int | None = None) -> tuple[float, float]:
    """DeepNorm's residual scale ``a`` and init gain ``b`` (Wang et al. 2022, Table 1; DESIGN §2).

    Args:
        n_layers: ``N``, the number of blocks (for ``"enc-dec-encoder"`` the encoder's).
        architecture: ``"decoder"`` (decoder-only, autoln's language models), ``"encoder"``,
            ``"enc-dec-encoder"`` or ``"enc-dec-decoder"``.
        n_decoder_layers: ``M``, the decoder's blocks; required for the two enc-dec rows
            (for ``"enc-dec-decoder"`` only ``M`` is used).

    Returns:
        ``(a, b)``: decoder- or encoder-only ``((2N)^(1/4), (8N)^(-1/4))``; enc-dec encoder
        ``(0.81 (N^4 M)^(1/16), 0.87 (N^4 M)^(-1/16))``; enc-dec decoder
        ``((3M)^(1/4), (12M)^(-1/4))``. N=6 gives (1.861, 0.380), N=12 (2.213, 0.320).

    Raises:
        ValueError: non-positive layer counts, unknown architecture, or ``M`` missing.
    """
    if n_layers <= 0:
        raise ValueError(f"n_layers must be positive, got {n_layers}")
    if architecture in ("decoder", "encoder"):
        return (2 * n_layers) ** 0.25, (8 * n_layers) ** -0.25
    if architecture not in ("enc-dec-encoder", "enc-dec-decoder"):
        raise ValueError(f"unknown architecture {architecture!r}")
    if n_decoder_layers is None or n_decoder_layers <= 0:
        raise ValueError(f"architecture {architecture!r} needs a positive n_decoder_layers (M)")
    m = n_decoder_layers
    if architecture == "enc-dec-encoder":
        return 0.81 * (n_layers**4 * m) ** (1 / 16), 0.87 * (n_layers**4 * m) ** (-1 / 16)
    return (3 * m) ** 0.25, (12 * m) ** -0.25


class Placement(nn.Module, abc.ABC):
    """Base class of a norm placement around one sublayer branch.

    Args:
        d_model: width of the residual stream.
        n_layers: ``N``, the number of blocks of the model (DeepNorm's constants use it).
        norm: key of :data:`NORMS`.

    Subclasses set ``name`` and ``raw_input`` and implement :meth:`output` (and
    :meth:`branch_input` when ``raw_input`` is False).
    """

    name: ClassVar[str]
    raw_input: ClassVar[bool] = True
    ends_in_norm: ClassVar[bool] = False

    def __init__(self, d_model: int, n_layers: int, norm: str) -> None:
        super().__init__()
        self.d_model, self.n_layers = d_model, n_layers

    def branch_input(self, x: torch.Tensor) -> torch.Tensor:
        """What ``F`` is fed, ``(B, T, d_model)``; the residual stream itself by default."""
        return x

    @abc.abstractmethod
    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        """The sublayer's output ``(B, T, d_model)`` from its input ``x`` and ``fx = F(branch_input(x))``."""

    def init_gain(self) -> float:
        """Gain on the branch's value/output/FFN weights at init in the derived model."""
        return 1.0

    def mix_into(self, acc: Optional[torch.Tensor], x: torch.Tensor, fx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """One term of the supernet's mixture (DESIGN §3): ``acc + weight * output(x, fx)``
        ``(B, T, d_model)``, or ``weight * output(x, fx)`` when ``acc`` is None; ``weight`` is
        this candidate's scalar mixing weight (a 0-d tensor)."""
        y = self.output(x, fx)
        return weight * y if acc is None else torch.addcmul(acc, weight, y)

    def forward(self, x: torch.Tensor, branch: nn.Module) -> torch.Tensor:
        """``output(x, branch(branch_input(x)))``: the whole sublayer, ``(B, T, d_model)``."""
        return self.output(x, branch(self.branch_input(x)))


class PreLN(Placement):
    """Pre-LN: ``x + F(LN(x))`` (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture")."""

    name = "pre"
    raw_input = False

    def __init__(self, d_model: int, n_layers: int, norm: str) -> None:
        super().__init__(d_model, n_layers, norm)
        self.norm = NORMS[norm](d_model)

    def branch_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return x + fx


class PostLN(Placement):
    """Post-LN: ``LN(x + F(x))`` (Vaswani et al. 2017, "Attention Is All You Need")."""

    name = "post"

    def __init__(self, d_model: int, n_layers: int, norm: str) -> None:
        super().__init__(d_model, n_layers, norm)
        self.norm = NORMS[norm](d_model)

    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return self.norm(x + fx)

    ends_in_norm = True

    def mix_into(self, acc: Optional[torch.Tensor], x: torch.Tensor, fx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = scaled_norm(self.norm, x + fx, weight)
        return y if acc is None else acc + y


class DeepNorm(Placement):
    """DeepNorm: ``LN(a * x + F(x))`` with the fixed constant ``a = (2N)^(1/4)``; the derived
    model initialises the branch's value, output and FFN weights with gain ``b = (8N)^(-1/4)``
    (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers", decoder-only row).
    """

    name = "deepnorm"

    def __init__(self, d_model: int, n_layers: int, norm: str) -> None:
        super().__init__(d_model, n_layers, norm)
        self.norm = NORMS[norm](d_model)
        self.alpha, self.beta = deepnorm_constants(n_layers)

    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.add(fx, x, alpha=self.alpha))

    ends_in_norm = True

    def mix_into(self, acc: Optional[torch.Tensor], x: torch.Tensor, fx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = scaled_norm(self.norm, torch.add(fx, x, alpha=self.alpha), weight)
        return y if acc is None else acc + y

    def init_gain(self) -> float:
        return self.beta


#: Placement classes by candidate name (``model.candidates``, genotype ``placements``).
PLACEMENTS: dict[str, type[Placement]] = {cls.name: cls for cls in (PreLN, PostLN, DeepNorm)}


def build_placement(name: str, d_model: int, n_layers: int, norm: str) -> Placement:
    """Factory: the placement registered as ``name``.

    Raises:
        KeyError: ``name`` is not in :data:`PLACEMENTS` (configs and genotypes are validated
            before they get here, so users see a named error instead).
    """
    return PLACEMENTS[name](d_model, n_layers, norm)
