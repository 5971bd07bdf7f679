"""Search the norm placement of your own model (the README's *Your own model*).

The same rooms as autoln's own search, opened to any PyTorch model:

- :class:`autoln.model.Site` (exported as ``autoln.Site``) wraps one sublayer of the user's
  block: ``x = x + self.attn(self.ln_1(x))`` becomes ``x = self.attn_site(x, self.attn)``. A site
  with several candidates is a supernet site; with one, a derived model's sublayer. Candidates
  are the registry of :mod:`autoln.placements`.
- :class:`SearchModel` turns a model holding searchable sites into a supernet
  (:class:`autoln.supernet.SupernetMixin`: alphas ``(n_sites, K)``, mixing, projection), so
  the architect (:class:`autoln.architect.Architect`), the weight step and the selections of
  :mod:`autoln.selection` run on it unchanged.
- :func:`search` runs the bilevel loop (DARTS, Liu et al. 2019), reads the genotype off
  (``search.selection``: DARTS-PT's perturbation by default) and returns a
  :class:`SiteGenotype`: one placement per site, by the site's module name.
- :func:`derive` keeps each site's chosen placement (a searched model becomes its derived
  model, exactly: the one-hot equivalence), and on a fresh model applies DeepNorm's init gain
  to the branch weights the user names.
- :func:`load_derived` loads a finished ``retrain.py`` run of autoln's own model back as a
  plain ``nn.Module``.

Batches are ``(x, y)`` pairs of tensors, e.g. token ids ``(B, T)`` and next-token targets
``(B, T)``; the loss is whatever ``loss_fn(model, x, y)`` returns (by default nanoGPT's
convention: ``model(x, y)`` returns ``(logits, loss)``, or logits scored by cross-entropy).
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .config import SearchConfig
from .errors import GenotypeError, OutputError
from .mixing import MIXINGS
from .model import Site, TransformerLM
from .placements import parse_name, placement_names
from .supernet import SupernetMixin

LossFn = Callable[[nn.Module, torch.Tensor, Optional[torch.Tensor]], tuple[Optional[torch.Tensor], Optional[torch.Tensor]]]
SITE_FORMAT = "autoln.site-genotype"


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


def searchable_sites(model: nn.Module) -> list[tuple[str, Site]]:
    """``(module name, site)`` of every :class:`autoln.model.Site` of ``model`` with two or more
    candidates, in module order (the order of the alpha rows)."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, Site) and len(m.placements) > 1]


class SearchModel(SupernetMixin, nn.Module):
    """A user's model with searchable :class:`autoln.model.Site` s, as a supernet.

    One alpha row per site, in module order (:attr:`site_names` are the sites' module names);
    every site must offer the same candidates. ``forward(x, y, mix=None)`` sets each site's
    mixing weights (``mix`` ``(n_sites, K)``, by default :meth:`mixing_weights`), calls
    ``loss_fn(model, x, y)`` and returns its ``(logits, loss)``.

    Args:
        model: the user's module; its parameters are the supernet's weights.
        loss_fn: ``(model, x, y) -> (logits, loss)``; default :func:`nanogpt_loss`.
        arch_init_std: alphas start as ``arch_init_std * randn`` (DARTS: 1e-3).
        tau: the mixing temperature (the search anneals it).
        mixing: a key of :data:`autoln.mixing.MIXINGS`.

    Raises:
        ValueError: no site with two or more candidates; sites with different candidate lists;
            an unknown ``mixing``.
    """

    def __init__(self, model: nn.Module, loss_fn: Optional[LossFn] = None, arch_init_std: float = 1e-3, tau: float = 1.0,
                 mixing: str = "softmax") -> None:
        super().__init__()
        if mixing not in MIXINGS:
            raise ValueError(f"unknown mixing {mixing!r}; expected one of {list(MIXINGS)}")
        sites = searchable_sites(model)
        if not sites:
            raise ValueError("the model holds no autoln.Site with two or more candidates: nothing to search "
                             "(wrap each sublayer as x = self.attn_site(x, self.attn), see the README's 'Your own model')")
        cands = list(sites[0][1].placements)
        for name, site in sites:
            if list(site.placements) != cands:
                raise ValueError(f"site {name!r} offers {list(site.placements)} but {sites[0][0]!r} offers {cands}: "
                                 "every searched site needs the same candidates, in the same order")
        self.model = model
        self.loss_fn = loss_fn or nanogpt_loss
        self.sites = [s for _, s in sites]  # plain list: the sites are registered once, inside model
        self.site_names = [n for n, _ in sites]
        self.candidates = cands
        self.tau, self.mixing = tau, mixing
        self.projected: dict[int, int] = {}
        self.alphas = nn.Parameter(arch_init_std * torch.randn(len(sites), len(cands), device=_device(model)))

    def arrange(self, weights: torch.Tensor) -> torch.Tensor:
        """One row per site: ``(n_sites, K)`` as is."""
        return weights

    def forward(self, x: torch.Tensor, y: Optional[torch.Tensor] = None, mix: Optional[torch.Tensor] = None):
        """``(logits, loss)`` of ``loss_fn`` with every site mixing by its row of ``mix``
        ``(n_sites, K)`` (default :meth:`mixing_weights`, with fresh Gumbel noise in training mode
        for stochastic mixings)."""
        mix = self.mixing_weights(self.draw_gumbel()) if mix is None else mix
        for site, row in zip(self.sites, mix):
            site.mix = row
        try:
            return self.loss_fn(self.model, x, y)
        finally:
            for site in self.sites:
                site.mix = None


def _device(model: nn.Module) -> torch.device:
    return next(itertools.chain(model.parameters(), [torch.empty(0)])).device


@dataclass
class SiteGenotype:
    """The answer of :func:`search` for a user's model: the chosen placement of each site, by the
    site's module name, with the final probabilities (``K`` per site, ordered as
    ``candidates``) and free-form ``provenance``. JSON format ``autoln.site-genotype``
    version 1 (:meth:`save`, :meth:`load`)."""

    candidates: list[str]
    sites: dict[str, str]
    probabilities: dict[str, list[float]]
    provenance: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        """The placements in site order, e.g. ``post pre pre post``."""
        return " ".join(self.sites.values())

    def to_dict(self) -> dict[str, Any]:
        """The JSON object."""
        return {"format": SITE_FORMAT, "version": 1, "candidates": list(self.candidates), "sites": dict(self.sites),
                "probabilities": {k: list(v) for k, v in self.probabilities.items()}, "provenance": self.provenance}

    @classmethod
    def from_dict(cls, obj: Any, source: str = "site genotype") -> "SiteGenotype":
        """Validate and build.

        Raises:
            GenotypeError: naming ``source`` and the field: wrong format or version, an unknown
                candidate, a site whose placement is not a candidate, probabilities that are not
                ``K`` finite non-negative numbers summing to 1.
        """
        def fail(key: str, why: str) -> GenotypeError:
            return GenotypeError(f"{source}: field '{key}': {why}")

        if not isinstance(obj, dict) or obj.get("format") != SITE_FORMAT or obj.get("version") != 1:
            raise fail("format", f"expected format {SITE_FORMAT!r} version 1 (a genotype of autoln.search)")
        cands = obj.get("candidates")
        if not isinstance(cands, list) or len(cands) < 1 or any(c not in placement_names() for c in cands):
            raise fail("candidates", f"expected names of {placement_names()}, got {cands!r}")
        sites, probs = obj.get("sites"), obj.get("probabilities")
        if not isinstance(sites, dict) or not sites:
            raise fail("sites", "expected an object: site module name -> placement")
        if not isinstance(probs, dict) or set(probs) != set(sites):
            raise fail("probabilities", "expected one list per site, for the same sites")
        for name, placement in sites.items():
            if placement not in cands:
                raise fail(f"sites.{name}", f"expected one of the candidates {cands}, got {placement!r}")
            row = probs[name]
            if not isinstance(row, list) or len(row) != len(cands) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in row) \
                    or abs(sum(row) - 1.0) > 1e-4:
                raise fail(f"probabilities.{name}", f"expected {len(cands)} finite non-negative numbers summing to 1, got {row!r}")
        provenance = obj.get("provenance", {})
        return cls(list(cands), dict(sites), {k: [float(v) for v in r] for k, r in probs.items()},
                   provenance if isinstance(provenance, dict) else {})

    def save(self, path: str | Path) -> Path:
        """Write the JSON atomically (checked as :meth:`load` will first). Returns the path."""
        from .io import json_safe, write_json_atomic

        SiteGenotype.from_dict(json_safe(self.to_dict()), source=f"the genotype to write to {path}")
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> "SiteGenotype":
        """Read and validate a file written by :meth:`save`.

        Raises:
            GenotypeError: unreadable, not JSON, or a check of :meth:`from_dict` failing.
        """
        try:
            obj = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise GenotypeError(f"cannot read site genotype {path}: {exc}") from None
        return cls.from_dict(obj, source=str(path))


@dataclass
class SearchOutcome:
    """What :func:`search` returns: the genotype, the trained :class:`SearchModel` (its sites
    left one-hot at the answer by the selection) and per-step losses (nats per token)."""

    genotype: SiteGenotype
    model: SearchModel
    losses: list[float]


def _forever(batches: Iterable, what: str) -> Iterator:
    """Batches without end: re-iterates ``batches`` (a DataLoader or a list) when it runs out."""
    while True:
        count = 0
        for batch in batches:
            count += 1
            yield batch
        if count == 0:
            raise ValueError(f"{what} gave no batch (expected (x, y) pairs; a generator is used up after one pass: "
                             "pass a list or a DataLoader)")


def search(model: nn.Module, train_batches: Iterable, *, steps: int, arch_batches: Optional[Iterable] = None,
           cfg: Optional[SearchConfig] = None, loss_fn: Optional[LossFn] = None, seed: int = 0,
           progress: bool = True) -> SearchOutcome:
    """The bilevel search (docs/design.md §4) on a user's model with searchable sites.

    Each step takes one alpha step on a D_alpha batch (first- or second-order, per
    ``cfg.order``; none during ``cfg.arch_warmup_steps`` or with ``cfg.arch_lr`` 0), then one
    weight step (AdamW with ``cfg``'s schedule) on a D_w batch; the temperature falls from
    ``cfg.tau_start`` to ``cfg.tau_end``. Then the genotype is read off per ``cfg.selection``:
    ``perturbation`` (DARTS-PT, with ``cfg.selection_tune_steps`` bilevel steps between two
    decisions), ``score`` (SPOS) or ``argmax``, on ``cfg.selection_windows // batch`` fixed
    D_alpha batches.

    Args:
        model: the user's module, with :class:`autoln.model.Site` s of two or more candidates;
            it is trained in place (its device is the search's).
        train_batches: ``(x, y)`` batches for the weights (re-iterated when used up).
        steps: bilevel steps.
        arch_batches: ``(x, y)`` batches for the alphas (D_alpha); default: every other batch
            of ``train_batches`` (DARTS' half split).
        cfg: the search settings (:class:`autoln.config.SearchConfig`); default the CPU
            default's, with the warm-ups fitted to ``steps`` (a tenth, and a fifth for the alphas).
        loss_fn: ``(model, x, y) -> (logits, loss)``; default :func:`nanogpt_loss`.
        seed: torch's seed for the alphas and the selection order.
        progress: a tqdm bar on a terminal.

    Returns:
        :class:`SearchOutcome`.

    Raises:
        ConfigError: an invalid ``cfg`` (the message names the key).
        ValueError: as :class:`SearchModel`; batches that run out at once.
    """
    from .architect import Architect, weight_step
    from .run_search import temperature
    from .selection import perturbation_select, score_select
    from .training import progress_bar, weight_optimizer

    if cfg is None:
        cfg = SearchConfig(steps=steps, warmup_steps=min(50, steps // 10), arch_warmup_steps=min(100, steps // 5))
    cfg = replace(cfg, steps=steps)
    cfg.validate()
    torch.manual_seed(seed)
    supernet = SearchModel(model, loss_fn, cfg.arch_init_std, cfg.tau_start, cfg.mixing)
    device = supernet.alphas.device
    opt, sched = weight_optimizer(supernet.named_weight_parameters(), cfg)
    architect = Architect(supernet, cfg)
    stream = _forever(train_batches, "train_batches")
    arch_stream = _forever(arch_batches, "arch_batches") if arch_batches is not None else stream

    def batch(it) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = next(it)
        return x.to(device), y.to(device)

    def bilevel(step: int) -> float:
        supernet.tau = temperature(cfg, step)
        batch_w, batch_a = batch(stream), batch(arch_stream)
        if step > cfg.arch_warmup_steps and cfg.arch_lr > 0:
            architect.step(batch_w, batch_a, xi=sched.get_last_lr()[0], step=step)
        loss, _ = weight_step(supernet, opt, sched, *batch_w, cfg.grad_clip, noise=0.0)
        return loss

    supernet.train()
    bar = progress_bar(range(1, steps + 1), show=progress, desc="search", unit="step")
    losses = []
    for step in bar:
        losses.append(bilevel(step))
        bar.set_postfix_str(f"train loss {losses[-1]:.3f}")
    bar.close()
    # fixed D_alpha batches on which the selection measures the supernet's loss
    first = batch(arch_stream)
    fixed = [first] + [batch(arch_stream) for _ in range(max(0, math.ceil(cfg.selection_windows / len(first[0])) - 1))]

    @torch.no_grad()
    def loss_of(mix: torch.Tensor) -> float:
        was = supernet.training
        supernet.eval()
        total = sum(float(supernet(x, y, mix=mix)[1]) * y.numel() for x, y in fixed)
        supernet.train(was)
        return total / sum(y.numel() for _, y in fixed)

    provenance: dict[str, Any] = {"steps": steps, "selection": cfg.selection, "site_names": supernet.site_names,
                                  "final_train_loss": losses[-1] if losses else None}
    if cfg.selection == "perturbation":
        order = [int(i) for i in np.random.default_rng([seed, 6]).permutation(len(supernet.site_names))]
        tuned = itertools.count(steps + 1)

        def tune() -> None:
            for _ in range(cfg.selection_tune_steps):
                bilevel(min(next(tuned), steps))

        sel = perturbation_select(supernet, loss_of, tune, order)
        choices = sel.choices
        provenance["loss_rises"] = {n: [round(float(v), 6) for v in row] for n, row in zip(supernet.site_names, sel.loss_rises)}
    elif cfg.selection == "score":
        scored = score_select(supernet, loss_of, seed)
        choices = scored.choices
        provenance.update({"search": scored.method, "evaluated": scored.evaluated, "loss": scored.loss})
    else:
        choices = [int(i) for i in supernet.alphas.detach().argmax(-1).tolist()]
        supernet.projected = dict(enumerate(choices))
    probs = supernet.probabilities()
    genotype = SiteGenotype(list(supernet.candidates), {n: supernet.candidates[c] for n, c in zip(supernet.site_names, choices)},
                            {n: [float(v) for v in row] for n, row in zip(supernet.site_names, probs)}, provenance)
    return SearchOutcome(genotype, supernet, losses)


def derive(model: nn.Module, genotype: SiteGenotype, deepnorm_weights: Optional[Callable[[str], Iterable[nn.Parameter]]] = None,
           init: bool = True) -> nn.Module:
    """Turn ``model`` (its searched :class:`autoln.model.Site` s, or a fresh instance of the
    same class) into the derived model of ``genotype``: each site keeps only its chosen
    placement, with that placement's own norm modules (so a trained supernet's derived model
    computes exactly what the supernet computes with one-hot weights). A :class:`SearchModel`
    is unwrapped. In place; returns the model.

    With ``init`` (a fresh model, to be retrained from scratch) every site that chose DeepNorm
    gets DeepNorm's init gain ``b = (8N)^(-1/4)`` (Wang et al. 2022) on the branch weights
    ``deepnorm_weights(site_name)`` returns: the value and output projections of attention,
    both FFN layers. Use ``init=False`` on a trained model.

    Raises:
        GenotypeError: a site of the genotype that the model lacks, a searched site of the model
            that the genotype lacks, or a placement the site does not offer.
        ValueError: ``init`` with DeepNorm sites and no ``deepnorm_weights``.
    """
    if isinstance(model, SearchModel):
        model = model.model
    sites = dict((n, m) for n, m in model.named_modules() if isinstance(m, Site))
    missing = [n for n in genotype.sites if n not in sites]
    if missing:
        raise GenotypeError(f"the genotype names sites the model lacks: {missing} (the model's sites: {list(sites)})")
    unset = [n for n, s in sites.items() if len(s.placements) > 1 and n not in genotype.sites]
    if unset:
        raise GenotypeError(f"the model's searched sites {unset} have no placement in the genotype")
    deep = [n for n, p in genotype.sites.items() if parse_name(p)[0] == "deepnorm"]
    if init and deep and deepnorm_weights is None:
        raise ValueError(f"sites {deep} chose DeepNorm, whose derived model starts its branch weights at gain b: name them, "
                         "derive(model, genotype, deepnorm_weights=lambda site: [...value, output and FFN weights...]), "
                         "or pass init=False for a trained model")
    for name, placement in genotype.sites.items():
        site = sites[name]
        if placement not in site.placements:
            raise GenotypeError(f"site {name!r} offers {list(site.placements)}, not the genotype's {placement!r}")
        site.placements = nn.ModuleDict({placement: site.placements[placement]})
        site.mix = None
        if init and name in deep:
            with torch.no_grad():
                for weight in deepnorm_weights(name):
                    weight.mul_(site.placements[placement].beta)
    return model


def load_derived(run_dir: str | Path, device: str | torch.device = "cpu") -> TransformerLM:
    """The derived model of a finished ``retrain.py`` run, as a plain ``nn.Module`` in eval mode:
    autoln's :class:`autoln.model.TransformerLM` built from the run's genotype and config, with
    the weights of its last step (``checkpoint.pt``). Call it on token ids ``(B, T)`` for
    ``(logits (B, T, V), None)``, or with targets for the loss in nats per token; fine-tune it
    with any optimizer.

    Raises:
        OutputError: ``run_dir`` holds no finished retrain (``metrics.json`` and
            ``checkpoint.pt``), or its checkpoint is unreadable or of a search.
    """
    from .config import Config, with_defaults
    from .genotype import Genotype
    from .model import build_derived

    run_dir = Path(run_dir)
    if not (run_dir / "metrics.json").is_file() or not (run_dir / "checkpoint.pt").is_file():
        raise OutputError(f"{run_dir}: no finished retrain here (expected metrics.json and checkpoint.pt, as retrain.py writes)")
    try:
        ckpt = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: one line
        raise OutputError(f"{run_dir / 'checkpoint.pt'} is not a readable autoln checkpoint ({type(exc).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("kind") != "retrain":
        raise OutputError(f"{run_dir / 'checkpoint.pt'} is not a retrain's checkpoint")
    genotype = Genotype.from_dict(ckpt["genotype"], source=str(run_dir / "checkpoint.pt"))
    recorded = with_defaults(ckpt["config"])
    base = Config().model
    mc = genotype.model_config(replace(base, **{k: v for k, v in recorded["model"].items() if hasattr(base, k)}))
    model = build_derived(mc, genotype.model["vocab_size"], genotype.block_placements())
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval()
