"""The search space: where a sublayer's norm goes (docs/design.md §2).

A *placement* wraps a sublayer branch ``F`` (causal self-attention or FFN) with its norms and
residual connection. Each placement is one class registered in :data:`PLACEMENTS`; adding a
candidate is one class and one registry line. A placement declares

- ``branch_input(x)``: what ``F`` is fed (``LN(x)`` for Pre-LN, ``x`` itself for Post-LN and
  DeepNorm; placements with ``raw_input = True`` feed ``x`` and so share one call of ``F``);
- ``output(x, fx)``: how ``F``'s output joins the residual stream;
- ``init_branch(branch, residual_init)``: how the *derived* model starts the branch's weights:
  GPT-2's residual scaling of the output projections by ``1/sqrt(2N)`` for every placement
  (:func:`scale_residual_branch`), DeepNorm its own gain ``b`` on value, output and FFN weights;
- ``mix_into(acc, x, fx, w)``: ``acc + w * output(x, fx)``, one term of the supernet's
  mixture. Placements that end in a norm (``ends_in_norm``) fold ``w`` into the norm's gain and
  bias (``w * LN_{g,b}(z) = LN_{w g, w b}(z)``); the others use one fused ``addcmul``. Either
  way one full-size operation per candidate and site is saved.

All tensors are ``(batch, time, d_model)`` floats.
"""

from __future__ import annotations

import abc
from typing import Callable, ClassVar, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

class DyT(nn.Module):
    """Dynamic Tanh, ``g * tanh(c * x) + b`` elementwise over the last dimension, a drop-in for a
    norm (Zhu, Chen, He, LeCun, Liu 2025, "Transformers without Normalization", Alg. 1): ``c``
    a learnable scalar initialised to ``init_c`` (the paper's 0.5 for non-LLM models), ``g``
    and ``b`` elementwise (ones and zeros), or absent with ``affine=False``. ``(..., d)`` in and out."""

    def __init__(self, d: int, affine: bool = True, init_c: float = 0.5, bias: bool = True) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(init_c)))
        self.weight = nn.Parameter(torch.ones(d)) if affine else None
        self.bias = nn.Parameter(torch.zeros(d)) if affine and bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.alpha * x)
        if self.weight is None:
            return y
        return y * self.weight if self.bias is None else torch.addcmul(self.bias, y, self.weight)


#: Norm types by config name (``model.norm``): ``NORMS[name](d_model, affine=True, bias=True)``.
#: With ``affine=False`` the elementwise gain and bias are fixed at 1 and 0 (absent); with
#: ``bias=False`` the gain is learnable and there is no bias (RMSNorm never has one).
NORMS: dict[str, Callable[..., nn.Module]] = {
    "layernorm": lambda d, affine=True, bias=True: nn.LayerNorm(d, elementwise_affine=affine, bias=bias),
    "rmsnorm": lambda d, affine=True, bias=True: nn.RMSNorm(d, elementwise_affine=affine),
    "dyt": lambda d, affine=True, bias=True: DyT(d, affine, bias=bias),
}


def scaled_norm(norm: nn.Module, z: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``scale * norm(z)`` computed as one norm whose elementwise gain and bias are multiplied
    by ``scale`` (a scalar tensor): equal up to rounding, one full-size ``(B, T, d_model)``
    operation fewer. ``norm``: an :class:`torch.nn.LayerNorm`, :class:`torch.nn.RMSNorm` or
    :class:`DyT` built by :data:`NORMS` (without gain: ``scale`` times the plain norm).

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
    if isinstance(norm, DyT):
        y = torch.tanh(norm.alpha * z)
        if norm.weight is None:
            return scale * y
        if norm.bias is None:
            return y * (norm.weight * scale)
        return torch.addcmul(norm.bias * scale, y, norm.weight * scale)
    raise TypeError(f"scaled_norm: unsupported norm {type(norm).__name__}")


def deepnorm_constants(n_layers: int, architecture: str = "decoder", n_decoder_layers: int | None = None) -> tuple[float, float]:
    """DeepNorm's residual scale ``a`` and init gain ``b`` (Wang et al. 2022, Table 1; docs/design.md §2).

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


FIXED = ":fixed"
#: ``model.residual_init`` values: ``scaled`` (GPT-2's ``1/sqrt(2N)``, the default) | ``unscaled``.
RESIDUAL_INITS = ("scaled", "unscaled")


def residual_scale(n_layers: int) -> float:
    """GPT-2's residual init scale ``1/sqrt(2N)`` for ``N = n_layers`` blocks (2N residual
    branches): Radford et al. 2019, "Language Models are Unsupervised Multitask Learners",
    §2.3 ("scale the weights of residual layers at initialization by a factor of 1/sqrt(N)
    where N is the number of residual layers"); nanoGPT's ``c_proj`` std ``0.02/sqrt(2 *
    n_layer)``. N=6 gives 0.2887, N=24 0.1443.

    Raises:
        ValueError: ``n_layers`` not positive.
    """
    if n_layers <= 0:
        raise ValueError(f"n_layers must be positive, got {n_layers}")
    return (2 * n_layers) ** -0.5


def scale_residual_branch(branch: nn.Module, n_layers: int, residual_init: str) -> None:
    """Multiply ``branch.output_projections()`` (the matrices that write into the residual
    stream: attention's output projection, the FFN's second layer) by :func:`residual_scale`
    when ``residual_init == "scaled"``; nothing for ``"unscaled"`` (plain ``xavier_normal_``).
    The start of every placement but DeepNorm in the derived model, and of every supernet
    site (one shared branch). In place; call under ``torch.no_grad()``.

    Raises:
        ValueError: unknown ``residual_init``.
    """
    if residual_init not in RESIDUAL_INITS:
        raise ValueError(f"model.residual_init: expected one of {list(RESIDUAL_INITS)}, got {residual_init!r}")
    if residual_init == "scaled":
        scale = residual_scale(n_layers)
        for weight in branch.output_projections():
            weight.mul_(scale)


def _mix_normed_branch(acc: Optional[torch.Tensor], x: torch.Tensor, norm: nn.Module, fx: torch.Tensor,
                       weight: torch.Tensor) -> torch.Tensor:
    """``acc + weight * (x + norm(fx))`` ``(B, T, d_model)`` for the placements whose branch
    output is normed (``peri``, ``outnorm``): the weight folded into the norm's gain and bias
    (:func:`scaled_norm`) and a fused ``addcmul`` for ``weight * x``."""
    y = torch.addcmul(scaled_norm(norm, fx, weight), weight, x)
    return y if acc is None else acc + y


class Placement(nn.Module, abc.ABC):
    """Base class of a norm placement around one sublayer branch.

    Args:
        d_model: width of the residual stream.
        n_layers: ``N``, the number of blocks of the model (DeepNorm's constants use it).
        norm: key of :data:`NORMS`.
        layer: ``l``, the 1-based index of the block (LayerNorm Scaling uses it).
        affine: the norms' elementwise gain and bias are learnable (True) or fixed at 1 and 0.
        bias: with ``affine``, the norms carry a learnable bias (True, ``nn.LayerNorm``'s
            default) or none (False: nanoGPT's ``bias=False``, LLaMA-style stacks).

    Subclasses set ``name``, ``input``, ``has_norm`` and ``normalises_stream`` and implement
    :meth:`output` (and :meth:`branch_input` unless ``input == "raw"``). ``input`` says what ``F`` is fed:
    ``"raw"`` (``x``: every such candidate of a site shares one call of ``F``), ``"norm"``
    (``self.norm(x)``: candidates of a site with the same ``affine`` share the module
    ``self.norm`` and so one call of ``F``, see :class:`autoln.models.site.Site`) or ``"own"`` (a
    call of its own). ``normalises_stream``: the sublayer's output, the residual stream the next
    sublayer reads, is itself a norm's output (Post-LN, DeepNorm: per-token RMS about 1 at unit
    gain), rather than the incoming stream plus a branch (:func:`stream_groups`).
    """

    name: ClassVar[str]
    input: ClassVar[str] = "raw"
    has_norm: ClassVar[bool] = True
    ends_in_norm: ClassVar[bool] = False
    normalises_stream: ClassVar[bool] = False

    def __init__(self, d_model: int, n_layers: int, norm: str, layer: int = 1, affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__()
        self.d_model, self.n_layers, self.layer, self.affine, self.norm_bias = d_model, n_layers, layer, affine, bias

    def branch_input(self, x: torch.Tensor) -> torch.Tensor:
        """What ``F`` is fed, ``(B, T, d_model)``; the residual stream itself by default."""
        return x

    @abc.abstractmethod
    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        """The sublayer's output ``(B, T, d_model)`` from its input ``x`` and ``fx = F(branch_input(x))``."""

    def init_gain(self) -> float:
        """Gain on the branch's value/output/FFN weights at init in the derived model (1; DeepNorm's ``b``)."""
        return 1.0

    def init_branch(self, branch: nn.Module, residual_init: str) -> None:
        """Start ``branch``'s weights (already ``xavier_normal_``) as this placement's derived
        model does: :func:`scale_residual_branch` (GPT-2's ``1/sqrt(2N)`` on the output
        projections, or nothing for ``residual_init="unscaled"``). In place, under ``no_grad``."""
        scale_residual_branch(branch, self.n_layers, residual_init)

    def mix_into(self, acc: Optional[torch.Tensor], x: torch.Tensor, fx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """One term of the supernet's mixture (docs/design.md §3): ``acc + weight * output(x, fx)``
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
    input = "norm"

    def __init__(self, d_model: int, n_layers: int, norm: str, layer: int = 1, affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__(d_model, n_layers, norm, layer, affine, bias)
        self.norm = NORMS[norm](d_model, affine, bias)

    def branch_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return x + fx


class PostLN(Placement):
    """Post-LN: ``LN(x + F(x))`` (Vaswani et al. 2017, "Attention Is All You Need")."""

    name = "post"
    ends_in_norm = True
    normalises_stream = True

    def __init__(self, d_model: int, n_layers: int, norm: str, layer: int = 1, affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__(d_model, n_layers, norm, layer, affine, bias)
        self.norm = NORMS[norm](d_model, affine, bias)

    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return self.norm(x + fx)

    def mix_into(self, acc: Optional[torch.Tensor], x: torch.Tensor, fx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = scaled_norm(self.norm, x + fx, weight)
        return y if acc is None else acc + y


class DeepNorm(Placement):
    """DeepNorm: ``LN(a * x + F(x))`` with the fixed constant ``a = (2N)^(1/4)``; the derived
    model initialises the branch's value, output and FFN weights with gain ``b = (8N)^(-1/4)``
    (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers", decoder-only row).
    """

    name = "deepnorm"
    ends_in_norm = True
    normalises_stream = True

    def __init__(self, d_model: int, n_layers: int, norm: str, layer: int = 1, affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__(d_model, n_layers, norm, layer, affine, bias)
        self.norm = NORMS[norm](d_model, affine, bias)
        self.alpha, self.beta = deepnorm_constants(n_layers)

    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return self.norm(torch.add(fx, x, alpha=self.alpha))

    def mix_into(self, acc: Optional[torch.Tensor], x: torch.Tensor, fx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = scaled_norm(self.norm, torch.add(fx, x, alpha=self.alpha), weight)
        return y if acc is None else acc + y

    def init_gain(self) -> float:
        return self.beta

    def init_branch(self, branch: nn.Module, residual_init: str) -> None:
        """DeepNorm's own start, whatever ``residual_init``: the value, output and FFN weights
        times ``b = (8N)^(-1/4)`` (Wang et al. 2022; torchscale divides them by ``(8N)^(1/4)``
        and applies no GPT-2 scaling on top)."""
        for weight in branch.residual_path_weights():
            weight.mul_(self.beta)


class PeriLN(Placement):
    """Peri-LN: ``x + LN_out(F(LN_in(x)))``, a norm on both sides of the branch (Kim et al.
    2025, "Peri-LN"; the same form as CogView's Sandwich-LN, Ding et al. 2021). ``LN_in`` is
    ``self.norm``: in the supernet it is the module of Pre-LN at the same site (same input,
    one call of ``F``)."""

    name = "peri"
    input = "norm"
    ends_in_norm = True

    def __init__(self, d_model: int, n_layers: int, norm: str, layer: int = 1, affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__(d_model, n_layers, norm, layer, affine, bias)
        self.norm = NORMS[norm](d_model, affine, bias)
        self.norm_out = NORMS[norm](d_model, affine, bias)

    def branch_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)

    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return x + self.norm_out(fx)

    def mix_into(self, acc: Optional[torch.Tensor], x: torch.Tensor, fx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return _mix_normed_branch(acc, x, self.norm_out, fx, weight)


class OutNorm(Placement):
    """Output norm: ``x + LN(F(x))``, the norm on the branch's output only (OLMo 2's
    "reordered norm", OLMo et al. 2024; Swin Transformer V2's res-post-norm, Liu et al. 2022)."""

    name = "outnorm"
    ends_in_norm = True

    def __init__(self, d_model: int, n_layers: int, norm: str, layer: int = 1, affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__(d_model, n_layers, norm, layer, affine, bias)
        self.norm = NORMS[norm](d_model, affine, bias)

    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return x + self.norm(fx)

    def mix_into(self, acc: Optional[torch.Tensor], x: torch.Tensor, fx: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return _mix_normed_branch(acc, x, self.norm, fx, weight)


class LayerNormScaling(Placement):
    """LayerNorm Scaling: Pre-LN with the norm's output scaled by ``1/sqrt(l)`` at block ``l``
    (1-based), ``x + F(LN(x) / sqrt(l))`` (Sun et al. 2025, "The Curse of Depth in Large
    Language Models"). Its branch input is its own (one call of ``F``)."""

    name = "lns"
    input = "own"

    def __init__(self, d_model: int, n_layers: int, norm: str, layer: int = 1, affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__(d_model, n_layers, norm, layer, affine, bias)
        self.norm = NORMS[norm](d_model, affine, bias)
        self.scale = layer ** -0.5

    def branch_input(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x) * self.scale

    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return x + fx


class NoNorm(Placement):
    """No norm: ``x + F(x)``, a control (the plain residual; only the final norm remains)."""

    name = "none"
    has_norm = False

    def output(self, x: torch.Tensor, fx: torch.Tensor) -> torch.Tensor:
        return x + fx


#: Placement classes by base name (``model.candidates``, genotype ``placements``; a name may
#: carry the suffix ``:fixed``, e.g. ``pre:fixed``, for fixed norm gains: :func:`parse_name`).
PLACEMENTS: dict[str, type[Placement]] = {cls.name: cls for cls in (PreLN, PostLN, DeepNorm, PeriLN, OutNorm, LayerNormScaling, NoNorm)}


def parse_name(name: str) -> tuple[str, bool]:
    """``(base name, affine)`` of a candidate name: ``"pre"`` -> ``("pre", True)``,
    ``"pre:fixed"`` -> ``("pre", False)``.

    Raises:
        KeyError: an unknown base name, or ``:fixed`` on a placement without norms (``none``).
    """
    base, fixed = (name[:-len(FIXED)], True) if name.endswith(FIXED) else (name, False)
    if base not in PLACEMENTS or (fixed and not PLACEMENTS[base].has_norm):
        raise KeyError(name)
    return base, not fixed


def placement_names() -> list[str]:
    """Every valid candidate name: each base name, then ``<name>:fixed`` for those with norms."""
    return [*PLACEMENTS, *(n + FIXED for n, cls in PLACEMENTS.items() if cls.has_norm)]


def build_placement(name: str, d_model: int, n_layers: int, norm: str, layer: int = 1, bias: bool = True) -> Placement:
    """Factory: the placement registered as ``name`` (with ``:fixed``: fixed norm gains) at
    1-based block ``layer``; ``bias``: its norms' learnable bias (see :class:`Placement`).

    Raises:
        KeyError: ``name`` is not a valid candidate name (configs and genotypes are validated
            before they get here, so users see a named error instead).
    """
    base, affine = parse_name(name)
    return PLACEMENTS[base](d_model, n_layers, norm, layer, affine, bias)


#: The two kinds of residual stream (:func:`stream_groups`).
STREAMS = ("unnormalised", "normalised")


def stream_groups(names: Sequence[str]) -> dict[str, list[str]]:
    """Candidate ``names`` split by the kind of residual stream they leave (the "split by
    stream" variant of docs/results.md; SiameseNorm, 2026: one stream cannot carry both kinds): ``"unnormalised"`` (the
    stream plus a branch: ``pre``, ``peri``, ``outnorm``, ``lns``, ``none``) and ``"normalised"``
    (a norm's output: ``post``, ``deepnorm``; :attr:`Placement.normalises_stream`), each in the
    order of ``names``; a group with no member is left out. A ``:fixed`` name goes with its base.

    Raises:
        KeyError: an unknown candidate name.
    """
    groups: dict[str, list[str]] = {}
    for name in names:
        kind = STREAMS[PLACEMENTS[parse_name(name)[0]].normalises_stream]
        groups.setdefault(kind, []).append(name)
    return {k: groups[k] for k in STREAMS if k in groups}


def branch_calls(names: Sequence[str]) -> int:
    """Branch calls per site of a supernet over candidate ``names``: one per distinct branch
    input (docs/design.md §2-3): one for all ``raw`` candidates, one per gain form for the
    ``norm`` ones (``pre``, ``peri``), one each for ``own`` (``lns``). Equals
    ``len(Site(names, ...).input_groups())``; e.g. 2 for ``pre, post, deepnorm``, 3 for the
    seven base names.

    Raises:
        KeyError: an unknown candidate name.
    """
    keys = set()
    for i, name in enumerate(names):
        base, affine = parse_name(name)
        kind = PLACEMENTS[base].input
        keys.add("raw" if kind == "raw" else ("norm", affine) if kind == "norm" else ("own", i))
    return len(keys)
