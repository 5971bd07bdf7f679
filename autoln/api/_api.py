"""Search the norm placement of your own model (the README's *Your own model*).

The same rooms as autoln's own search, opened to any PyTorch model:

- :class:`autoln.models.model.Site` (exported as ``autoln.Site``) wraps one sublayer of the user's
  block: ``x = x + self.attn(self.ln_1(x))`` becomes ``x = self.attn_site(x, self.attn)``. A site
  with several candidates is a supernet site; with one, a derived model's sublayer. Candidates
  are the registry of :mod:`autoln.space.placements`.
- :class:`SearchModel` turns a model holding searchable sites into a supernet
  (:class:`autoln.models.supernet.SupernetMixin`: alphas ``(n_sites, K)``, mixing, projection), so
  the architect (:class:`autoln.oneshot.architect.Architect`), the weight step and the selections of
  :mod:`autoln.oneshot.selection` run on it unchanged.
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
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from autoln.space.branches import deepnorm_weights as find_deepnorm_weights
from autoln.config import SearchConfig
from autoln.core.errors import GenotypeError, OutputError, cut, quoted
from autoln.models.genotype import FORMAT, SITE_FORMAT
from autoln.space.mixing import MIXINGS
from autoln.models.model import Site, TransformerLM
from autoln.space.placements import parse_name, placement_names
from autoln.models.supernet import SupernetMixin, set_candidate_scale

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


def searchable_sites(model: nn.Module) -> list[tuple[str, Site]]:
    """``(module name, site)`` of every :class:`autoln.models.model.Site` of ``model`` with two or more
    candidates, in module order (the order of the alpha rows); names as the plain model inside
    a DDP, DataParallel or ``torch.compile`` wrapper gives them (:func:`unwrap`)."""
    return [(name, m) for name, m in model_sites(unwrap(model)) if len(m.placements) > 1]


class SearchModel(SupernetMixin, nn.Module):
    """A user's model with searchable :class:`autoln.models.model.Site` s, as a supernet.

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
        for stochastic mixings)."""
        mix = self.mixing_weights(self.draw_gumbel()) if mix is None else mix
        for site, row in zip(self.sites, mix):
            site.mix = row
        try:
            return self.loss_fn(self.model, x, y)
        finally:
            for site in self.sites:
                site.mix = None
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
                ``K`` finite non-negative numbers summing to 1. Names and values from the file
                are quoted bounded (:func:`autoln.core.errors.quoted`), so a huge one still gives
                one short line.
        """
        def fail(key: str, why: str) -> GenotypeError:
            return GenotypeError(f"{source}: field '{cut(key)}': {why}")

        if isinstance(obj, dict) and obj.get("format") == FORMAT:
            raise GenotypeError(f"{source}: this is search.py's genotype of autoln's own model (format {FORMAT!r}), not "
                                f"autoln.search's genotype of a model of your own (format {SITE_FORMAT!r}); retrain it with "
                                "python retrain.py --genotype <its genotype.json>")
        if not isinstance(obj, dict) or obj.get("format") != SITE_FORMAT or obj.get("version") != 1:
            raise fail("format", f"expected format {SITE_FORMAT!r} version 1 (a genotype of autoln.search)")
        cands = obj.get("candidates")
        if not isinstance(cands, list) or len(cands) < 1 or any(c not in placement_names() for c in cands):
            raise fail("candidates", f"expected names of {placement_names()}, got {quoted(cands)}")
        sites, probs = obj.get("sites"), obj.get("probabilities")
        if not isinstance(sites, dict) or not sites:
            raise fail("sites", "expected an object: site module name -> placement")
        if not isinstance(probs, dict) or set(probs) != set(sites):
            raise fail("probabilities", "expected one list per site, for the same sites")
        for name, placement in sites.items():
            if placement not in cands:
                raise fail(f"sites.{name}", f"expected one of the candidates {quoted(cands)}, got {quoted(placement)}")
            row = probs[name]
            if not isinstance(row, list) or len(row) != len(cands) or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 for v in row) \
                    or abs(sum(row) - 1.0) > 1e-4:
                raise fail(f"probabilities.{name}", f"expected {len(cands)} finite non-negative numbers summing to 1, got {quoted(row)}")
        provenance = obj.get("provenance", {})
        return cls(list(cands), dict(sites), {k: [float(v) for v in r] for k, r in probs.items()},
                   provenance if isinstance(provenance, dict) else {})

    def save(self, path: str | Path) -> Path:
        """Write the JSON atomically (checked as :meth:`load` will first). Returns the path."""
        from autoln.core.io import json_safe, write_json_atomic

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


def as_site_genotype(genotype: Any, where: str) -> SiteGenotype:
    """``genotype`` as a :class:`SiteGenotype`: one as it is, or the path of a ``genotype.json``
    that :meth:`SiteGenotype.save` wrote (read and checked).

    Raises:
        GenotypeError: naming ``where`` and what was given: a string that is no file (a
            placement name among them: the baselines put one placement at every site), search.py's
            :class:`autoln.models.genotype.Genotype` (autoln's own model: retrain.py), anything else."""
    from autoln.models.genotype import Genotype

    if isinstance(genotype, SiteGenotype):
        return genotype
    expected = "expected an autoln.SiteGenotype (autoln.search's outcome.genotype) or the path of its genotype.json"
    if isinstance(genotype, (str, Path)):
        if Path(genotype).is_file():
            return SiteGenotype.load(genotype)
        hint = (f"; {genotype!r} is a placement: for it at every site use baselines=[{genotype!r}] of autoln.compare_genotypes"
                if str(genotype) in placement_names() else "")
        raise GenotypeError(f"{where}: {expected}, got {str(genotype)!r}, which is no file{hint}")
    if isinstance(genotype, Genotype):
        raise GenotypeError(f"{where}: this is search.py's genotype of autoln's own model (autoln.genotype.Genotype, format "
                            f"{FORMAT!r}); retrain it with python retrain.py --genotype <its genotype.json>. {expected}")
    raise GenotypeError(f"{where}: {expected}, got a {type(genotype).__name__}")


def check_build(build: Any, where: str) -> None:
    """Refuse a ``build`` that is not a function returning a fresh model.

    Raises:
        ValueError: naming ``where``: a model given instead of a builder, or not callable."""
    if isinstance(build, nn.Module):
        raise ValueError(f"{where}: build: expected a function that returns a fresh model, e.g. lambda: GPT(GPTConfig(...)), "
                         f"got a {type(build).__name__} model (every run starts from a new one)")
    if not callable(build):
        raise ValueError(f"{where}: build: expected a function that returns a fresh model, got a {type(build).__name__}")


def as_number(value: Any, where: str) -> float:
    """What an ``evaluate`` returned, as a float: a real number or a one-element tensor.

    Raises:
        ValueError: naming ``where``: anything else (None, a string, a bool, a tensor of
            several elements)."""
    import numbers

    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{where}: evaluate returned {cut(repr(value))} ({type(value).__name__}): expected a number, lower is "
                         "better (a loss)")
    return float(value)


def check_names(names: Any, where: str) -> Optional[list[str]]:
    """``names`` (None, or a list of distinct strings) as a list.

    Raises:
        ValueError: naming ``where``: one string (it would be read letter by letter), not a
            list of strings, or a name given twice."""
    if names is None:
        return None
    if isinstance(names, str):
        raise ValueError(f"{where}: expected a list of names, e.g. [{names!r}], got the string {names!r}")
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{where}: expected a list of names, got {cut(repr(names))}")
    twice = sorted({n for n in names if list(names).count(n) > 1})
    if twice:
        raise ValueError(f"{where}: {twice} given twice")
    return list(names)


@dataclass
class SearchOutcome:
    """What :func:`search` returns: the genotype, the trained :class:`SearchModel` (its sites
    left one-hot at the answer by the selection), per-step losses (nats per token) and
    ``notes``: one line each on what weakens the answer, as ``search.py`` prints them: alphas
    that could not separate in the steps given, then :func:`genotype_notes` (arbitrary choices,
    ties of the loss rises and how they were broken, overruled probabilities, no clear winner).
    With ``progress`` they are printed on stderr as the search ends."""

    genotype: SiteGenotype
    model: SearchModel
    losses: list[float]
    notes: list[str] = field(default_factory=list)


def as_pair(batch, what: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` as an ``(x, y)`` pair of tensors.

    Raises:
        ValueError: naming ``what`` and the batch's 0-based ``index``: not a pair of tensors."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch):
        return batch[0], batch[1]
    kind = type(batch).__name__ + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    raise ValueError(f"{what}: batch {index} is a {kind}, expected an (x, y) pair of tensors (token ids and targets, (B, T) each)")


def check_batches(batches, what: str, at_least: int = 1) -> None:
    """Refuse, before the first step, ``batches`` that cannot serve a search: not iterable; or,
    for a list or tuple (which can be looked at without drawing from it), fewer than
    ``at_least`` batches or a first batch that is not an ``(x, y)`` pair of tensors. Other
    iterables (a DataLoader, an endless generator as nanoGPT's ``get_batch`` loop) are checked
    batch by batch as they are drawn: looking ahead would draw from them.

    Raises:
        ValueError: naming ``what`` and what was expected."""
    if not hasattr(batches, "__iter__"):
        raise ValueError(f"{what}: expected a list, a DataLoader or a generator of (x, y) batches, got a {type(batches).__name__}")
    if isinstance(batches, (list, tuple)):
        if len(batches) < at_least:
            need = (f"at least {at_least} (without arch_batches every other batch is a D_alpha batch)" if at_least > 1 else "one")
            raise ValueError(f"{what} gave {len(batches)} batch{'es' if len(batches) != 1 else ''}, expected {need}")
        for i, batch in enumerate(batches[:at_least]):
            as_pair(batch, what, i)


class BatchStream:
    """``(x, y)`` batches without end from ``batches`` (a list or a DataLoader), re-iterated when
    used up and moved to ``device``; it counts what it gave, so a resumed search replays the
    iterable from its start and skips as many (bitwise for a list or a seeded DataLoader).

    Raises (when drawn):
        ValueError: ``batches`` gives no batch at all (e.g. a generator already used up).
    """

    def __init__(self, batches: Iterable, what: str, device: torch.device) -> None:
        self.batches, self.what, self.device = batches, what, device
        self.drawn, self._it = 0, None

    def _next_raw(self):
        for _ in range(2):
            if self._it is None:
                self._it = iter(self.batches)
            try:
                return next(self._it)
            except StopIteration:
                self._it = None
        raise ValueError(f"{self.what} gave no batch (expected (x, y) pairs; a generator is used up after one pass: "
                         "pass a list or a DataLoader)")

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = as_pair(self._next_raw(), self.what, self.drawn)
        self.drawn += 1
        return x.to(self.device), y.to(self.device)

    def state_dict(self) -> dict:
        """``{"drawn": n}``: the batches given so far."""
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        """Start again from the iterable's first batch and skip the ``drawn`` ones."""
        self._it, self.drawn = None, 0
        for _ in range(int(state["drawn"])):
            self._next_raw()
            self.drawn += 1


def first_batches(batches: Iterable, windows: int, what: str, every: int = 1, offset: int = 0) -> list:
    """The first batches of a fresh pass over ``batches`` (taking every ``every``-th from
    ``offset``) until they hold ``windows`` rows (at least one batch): the read-off's fixed
    D_alpha windows, as ``search.py``'s ``selection_windows``.

    Raises:
        ValueError: ``batches`` gives no batch."""
    out, rows = [], 0
    for i, batch in enumerate(batches):
        if i % every != offset:
            continue
        out.append(as_pair(batch, what, i))
        rows += len(out[-1][0])
        if rows >= windows:
            break
    if not out:
        raise ValueError(f"{what} gave no batch (expected (x, y) pairs)")
    return out


def default_config(steps: Optional[int] = None) -> SearchConfig:
    """The search settings of ``autoln.search`` without ``cfg``: ``search.py``'s default
    (:class:`autoln.config.SearchConfig`: 500 steps, warm-ups of 50 steps for the weights'
    learning rate and 100 for the alphas, perturbation-based selection). ``steps`` below the
    default's scale the two warm-ups with them (a tenth and a fifth of ``steps``), so the
    schedule keeps its shape; at or above 500 the warm-ups are the command's, as
    ``--set search.steps=N`` leaves them.

    Raises:
        ValueError: ``steps`` not a positive integer."""
    cli = SearchConfig()
    if steps is None:
        return cli
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"autoln.search: steps: expected a positive integer, got {steps!r}")
    return replace(cli, steps=steps, warmup_steps=min(cli.warmup_steps, steps // 10),
                   arch_warmup_steps=min(cli.arch_warmup_steps, steps // 5))


def alpha_travel_warning(cfg: SearchConfig, n_candidates: int) -> Optional[str]:
    """One line when the alphas cannot go far enough in ``cfg``'s steps, else None.

    Adam moves each alpha by about ``arch_lr`` per alpha step at most, so after the
    ``steps - arch_warmup_steps`` alpha steps two alphas of a site are at most
    ``2 * arch_lr * (steps - arch_warmup_steps)`` apart (logits, nats). One of ``K`` candidates
    reaches probability 0.9 at a gap of ``ln(9 (K - 1))`` (2.9 for ``K = 3``); below that the
    read-off decides between near-uniform probabilities. ``search.py``'s default reaches 8.0.
    ``arch_lr = 0`` (alphas frozen on purpose, DARTS-PT's uniform supernet) and
    ``selection = "score"`` (whole genotypes scored, the alphas not read) give None. The line
    has no prefix; :func:`search` prints it after ``autoln.search: warning:``."""
    if cfg.arch_lr == 0 or n_candidates < 2 or cfg.selection == "score":
        return None
    alpha_steps = max(cfg.steps - cfg.arch_warmup_steps, 0)
    reach, need = 2 * cfg.arch_lr * alpha_steps, math.log(9 * (n_candidates - 1))
    if reach >= need:
        return None
    return (f"the alphas cannot separate in {cfg.steps} steps: {alpha_steps} alpha steps at "
            f"arch_lr {cfg.arch_lr:g} move them at most {reach:.2f} apart, and one of {n_candidates} candidates needs "
            f"{need:.2f} to reach probability 0.9; give more steps ({math.ceil(need / (2 * cfg.arch_lr))} alpha steps after "
            f"the {cfg.arch_warmup_steps}-step warm-up at least; the command's default is {SearchConfig().steps} steps) "
            f"or a larger arch_lr in cfg")


#: The settings of :func:`search` that only say how fast it runs (:data:`autoln.config.PLACE_KEYS`
#: without their section): they may change on ``resume``. The model's own device is the user's.
API_PLACE_KEYS = ("device", "compile", "precision")


def check_resumable(out: Path, resume: bool, overwrite: bool, header: dict) -> Optional[dict]:
    """For :func:`search` with ``out``: the checkpoint to continue from (``resume``), or None.

    Raises:
        OutputError: ``out`` holds a finished search (without ``overwrite``), or an interrupted
            one without ``resume`` or ``overwrite``; the checkpoint is unreadable or not this
            kind's.
        ConfigError: with ``resume``, settings that differ from the checkpoint's (named).
    """
    from autoln.runs.checkpoint import NOT_BITWISE, resume_differences, thread_change
    from autoln.core.errors import ConfigError
    from autoln.runs.training import CHECKPOINT_FILE, check_out_dir

    if not resume:
        if (out / GENOTYPE_FILE).exists() and not overwrite:
            raise OutputError(f"out={str(out)!r} holds a finished search ({GENOTYPE_FILE}): choose another folder, "
                              "or pass overwrite=True")
        if (out / CHECKPOINT_FILE).exists() and not overwrite:
            raise OutputError(f"out={str(out)!r} holds an interrupted search ({CHECKPOINT_FILE}): pass resume=True to "
                              "continue it, or overwrite=True to start again")
        check_out_dir(out, True)
        return None
    if (out / GENOTYPE_FILE).exists():
        raise OutputError(f"resume: {out} holds a finished search ({GENOTYPE_FILE}); nothing to resume")
    path = out / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: one line
        raise OutputError(f"resume: {path} is not a readable autoln checkpoint ({type(exc).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("kind") != header["kind"]:
        raise OutputError(f"resume: {path} is not a checkpoint of autoln.search")
    diffs, place = resume_differences(ckpt["config"], header["config"], place_keys=API_PLACE_KEYS)
    if diffs:
        raise ConfigError(f"resume: the settings differ from the checkpoint's in {len(diffs)} key(s): " + "; ".join(diffs))
    place += thread_change(ckpt)
    if place:
        print(f"note: resume with {'; '.join(place)}: {NOT_BITWISE}", file=sys.stderr)
    return ckpt


def resume_hint(out: Path) -> str:
    """How an interrupted :func:`search` in ``out`` continues, for its stop messages."""
    return f"the same autoln.search(...) call with out={str(out)!r}, resume=True"


def check_folder(out: Path, resume: bool) -> None:
    """Refuse an ``out`` of :func:`search` that cannot be a run folder, in the API's words.

    Raises:
        OutputError: ``out`` or an ancestor is a file; with ``resume``, ``out`` does not exist."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"autoln.search: out={str(out)!r} exists and is not a folder")
    ancestor = out.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"autoln.search: out={str(out)!r}: {ancestor} is a file, not a folder")
    if resume and not out.is_dir():
        raise OutputError(f"autoln.search: resume=True: out={str(out)!r} does not exist, so there is no run to continue")


def check_search(model, steps, seed, shortlist, checkpoint_every, cfg, loss_fn, on_eval, out, tensorboard, resume,
                 train_batches, arch_batches, selection_batches, valid_batches) -> tuple[SearchConfig, Optional[Path]]:
    """:func:`search`'s arguments checked, before anything is built: ``(the settings, validated,
    with ``steps``; the run folder or None)``.

    Raises:
        ConfigError, OutputError, ValueError: as :func:`search` says."""
    from autoln.core.errors import ConfigError

    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"autoln.search: steps: expected a positive integer, got {steps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"autoln.search: seed: expected an integer, got {seed!r}")
    if isinstance(shortlist, bool) or not isinstance(shortlist, int) or not 0 <= shortlist <= 10:
        raise ValueError(f"autoln.search: shortlist: expected an integer from 0 to 10, got {shortlist!r}")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ValueError(f"autoln.search: checkpoint_every: expected an integer >= 0 (0: only at evaluations and on "
                         f"signals), got {checkpoint_every!r}")
    if not isinstance(model, nn.Module):
        raise ValueError(f"autoln.search: model: expected your model (an nn.Module with autoln.Site s), got a {type(model).__name__}")
    if cfg is not None and not isinstance(cfg, SearchConfig):
        hint = ": autoln.SearchConfig(**cfg) builds one from it" if isinstance(cfg, dict) else ""
        raise ConfigError(f"autoln.search: cfg: expected an autoln.SearchConfig, e.g. autoln.SearchConfig(steps=200), got a "
                          f"{type(cfg).__name__}{hint}")
    for name, fn in (("loss_fn", loss_fn), ("on_eval", on_eval)):
        if fn is not None and not callable(fn):
            raise ValueError(f"autoln.search: {name}: expected a function, got a {type(fn).__name__}")
    try:
        cfg = default_config(steps) if cfg is None else cfg if steps is None else replace(cfg, steps=steps)
        cfg.validate()
    except ConfigError as exc:  # the message names the key; the remedy in the API's terms
        raise ConfigError(f"autoln.search: cfg: {str(exc).split(' (e.g. --set')[0]}; in the API pass "
                          f"autoln.SearchConfig(..., key=value), or start from autoln.api.default_config({cfg.steps}), "
                          "whose warm-ups fit the steps") from None
    if out is None and (tensorboard or resume):
        raise ValueError("autoln.search: tensorboard and resume need a run folder: pass out=...")
    check_batches(train_batches, "train_batches", 1 if arch_batches is not None else 2)
    for what, batches in (("arch_batches", arch_batches), ("selection_batches", selection_batches),
                          ("valid_batches", valid_batches)):
        if batches is not None:
            check_batches(batches, what)
    if out is not None:
        out = Path(out)
        check_folder(out, resume)
    return cfg, out


#: The file :func:`search` writes its answer to in ``out``.
GENOTYPE_FILE = "genotype.json"


def search(model: nn.Module, train_batches: Iterable, *, steps: Optional[int] = None, arch_batches: Optional[Iterable] = None,
           cfg: Optional[SearchConfig] = None, loss_fn: Optional[LossFn] = None, seed: int = 0,
           progress: bool = True, selection_batches: Optional[Iterable] = None, valid_batches: Optional[Iterable] = None,
           out: Optional[str | Path] = None, resume: bool = False, overwrite: bool = False, tensorboard: bool = False,
           checkpoint_every: int = 100, on_eval: Optional[Callable[[int, dict], None]] = None,
           shortlist: int = 3) -> SearchOutcome:
    """The bilevel search (docs/design.md §4) on a user's model with searchable sites: the same
    loop as ``search.py`` (:class:`autoln.oneshot.search_loop.SearchLoop`) with the same pieces.

    Each step takes one alpha step on a D_alpha batch (first- or second-order, per
    ``cfg.order``; none during ``cfg.arch_warmup_steps`` or with ``cfg.arch_lr`` 0), then one
    weight step (AdamW with ``cfg``'s schedule, SDARTS noise per ``cfg.sdarts_eps``) on a D_w
    batch; the temperature falls from ``cfg.tau_start`` to ``cfg.tau_end``; the collapse monitor
    runs at each evaluation (every ``cfg.eval_every`` steps; R-DARTS' early stop with
    ``cfg.early_stop``). Then the genotype is read off per ``cfg.selection``: ``perturbation``
    (DARTS-PT, with ``cfg.selection_tune_steps`` bilevel steps between two decisions),
    ``score`` (SPOS) or ``argmax``, measured through :func:`autoln.runs.training.evaluate_batches`
    on fixed ``selection_batches``.

    Args:
        model: the user's module, with :class:`autoln.models.model.Site` s of two or more candidates
            (wrapped here as a :class:`SearchModel`, its alphas drawn after ``torch.manual_seed(seed)``),
            or a :class:`SearchModel` (used as it is); trained in place, on its own device.
        train_batches: ``(x, y)`` batches for the weights (re-iterated when used up).
        steps: bilevel steps; default ``cfg.steps``, and without ``cfg`` ``search.py``'s 500.
        arch_batches: ``(x, y)`` batches for the alphas (D_alpha); default: every other batch
            of ``train_batches`` (DARTS' half split).
        cfg: the search settings (:class:`autoln.config.SearchConfig`); default
            :func:`default_config` (``search.py``'s schedule, its warm-ups scaled for fewer
            steps). When the alphas cannot separate in the steps given
            (:func:`alpha_travel_warning`) one line says so on stderr and in the outcome's notes.
        loss_fn: ``(model, x, y) -> (logits, loss)``; default :func:`nanogpt_loss`.
        seed: the seed of the alphas (a plain model), the selection order and the scoring.
        progress: a tqdm bar on a terminal.
        selection_batches: the read-off's fixed batches; default, for D_alpha batches given as a
            list, its first batches holding ``cfg.selection_windows`` windows, and otherwise the
            next such batches of the D_alpha stream when the read-off begins. The first fixed
            batch's first ``cfg.monitor_windows`` rows are the collapse monitor's Hessian batch
            (none when the batches are drawn at the read-off: entropies only).
        valid_batches: batches on which the supernet's valid loss is measured at each
            evaluation (``valid/loss`` in TensorBoard, ``on_eval``'s metrics); default none.
        out: a run folder for ``checkpoint.pt`` (every ``checkpoint_every`` steps, at each
            evaluation, on SIGINT/SIGTERM), ``genotype.json`` and, with ``tensorboard``, the
            event files and ``alphas.png``; default none (nothing written).
        resume: continue the interrupted search in ``out`` from its checkpoint: call with the
            same model class, batches and settings; bitwise as an uninterrupted run on CPU. A
            folder without a checkpoint yet (stopped before its first) starts from step 0, as
            ``search.py --resume`` does; a folder that does not exist is refused.
        checkpoint_every: steps between checkpoints besides those at each evaluation and on
            SIGINT/SIGTERM (0: only those).
        overwrite: reuse an ``out`` that holds a finished or interrupted search.
        on_eval: ``fn(step, valid_metrics)`` after each evaluation; what it raises ends the run.
        shortlist: how many of the trained supernet's best whole genotypes by one-hot score
            (on the read-off's batches, before the read-off changes a weight) the genotype's
            provenance keeps as ``shortlist`` (``[{"sites": {site: placement}, "loss": nats/token}]``):
            the pool of :func:`autoln.race_genotypes` besides the read-off and the argmax.

    Returns:
        :class:`SearchOutcome`.

    Raises:
        ConfigError: an invalid ``cfg`` (the message names the key); with ``resume``, other
            settings than the checkpoint's.
        OutputError: ``out`` unusable, or holding a run (see ``resume``, ``overwrite``);
            its :class:`~autoln.core.errors.WriteError` when a file in ``out`` cannot be written
            for want of space (the previous checkpoint is kept; resume once there is space).
        ValueError: as :class:`SearchModel`; batches that run out at once; ``tensorboard``
            or ``resume`` without ``out``.
        DivergenceError: a NaN/inf loss under ``cfg.on_divergence: stop``.
        autoln.runs.checkpoint.Interrupted: SIGINT/SIGTERM with ``out`` (the checkpoint is written).
    """
    from contextlib import ExitStack

    from autoln.runs.checkpoint import StopSignals, space_errors_kept
    from autoln.core.locks import FolderLock

    cfg, out = check_search(model, steps, seed, shortlist, checkpoint_every, cfg, loss_fn, on_eval, out, tensorboard, resume,
                            train_batches, arch_batches, selection_batches, valid_batches)
    if not isinstance(model, SearchModel):
        torch.manual_seed(seed)
        model = SearchModel(model, loss_fn, cfg.arch_init_std, cfg.tau_start, cfg.mixing)
        set_candidate_scale(model, cfg.candidate_scale)
    travel = alpha_travel_warning(cfg, len(model.candidates))
    warnings = ([travel] if travel else []) + model.layer_notes
    for line in warnings:
        print(f"autoln.search: warning: {line}", file=sys.stderr, flush=True)
    with ExitStack() as stack:
        signals = None
        if out is not None:
            out = Path(out)
            signals = stack.enter_context(StopSignals(out / "checkpoint.pt", resume_hint(out)))
            stack.enter_context(FolderLock(out, "autoln.search"))
            stack.enter_context(space_errors_kept(out, resume_hint(out)))
        outcome = _search(model, cfg, train_batches, arch_batches, selection_batches, valid_batches, seed, progress,
                          out, resume, overwrite, tensorboard, checkpoint_every, on_eval, signals, shortlist)
    outcome.notes[:0] = warnings
    return outcome


def _search(model: SearchModel, cfg: SearchConfig, train_batches, arch_batches, selection_batches, valid_batches, seed: int,
            progress: bool, out: Optional[Path], resume: bool, overwrite: bool, tensorboard: bool, checkpoint_every: int,
            on_eval, signals, shortlist: int = 0) -> SearchOutcome:
    """The body of :func:`search`: the loop's data and pieces, the run, the answer."""
    from dataclasses import asdict

    from autoln.oneshot.search_loop import SearchData, SearchLoop
    from autoln.oneshot.search_pieces import Checkpointing, EvalHook, Monitor, Progress, TensorBoard, resume_loop
    from autoln.core.tb import Logger
    from autoln.runs.training import evaluate_batches, prepare_out_dir

    device = model.alphas.device
    weights = BatchStream(train_batches, "train_batches", device)
    alphas = BatchStream(arch_batches, "arch_batches", device) if arch_batches is not None else weights
    d_alpha, every, offset = (arch_batches, 1, 0) if arch_batches is not None else (train_batches, 2, 1)
    d_name = "arch_batches" if arch_batches is not None else "train_batches"
    fixed = [as_pair(b, "selection_batches", i) for i, b in enumerate(selection_batches)] if selection_batches is not None \
        else first_batches(d_alpha, cfg.selection_windows, d_name, every, offset) if isinstance(d_alpha, (list, tuple)) else None
    hessian = tuple(t[:cfg.monitor_windows].to(device) for t in fixed[0]) if cfg.monitor_windows and fixed else None
    if cfg.early_stop == "hessian" and hessian is None:
        raise ValueError("autoln.search: cfg.early_stop='hessian' needs a fixed Hessian batch: pass selection_batches "
                         "(its first batch serves), or arch_batches as a list")
    drawn: list = []

    def selection() -> list:  # the read-off's fixed batches; drawn from D_alpha at the read-off when not given
        if fixed is not None:
            return fixed
        if not drawn:
            drawn.append(alphas())
            while sum(len(b[0]) for b in drawn) < cfg.selection_windows:
                drawn.append(alphas())
        return drawn

    def load(state: dict) -> None:
        weights.load_state_dict(state["w"])
        if alphas is not weights:
            alphas.load_state_dict(state["alpha"])

    data = SearchData(weights, alphas, lambda mix: evaluate_batches(model, selection(), device, mix=mix),
                      valid=(lambda: {"loss": evaluate_batches(model, valid_batches, device)}) if valid_batches is not None else None,
                      state_dict=lambda: {"w": weights.state_dict(), "alpha": alphas.state_dict()}, load_state_dict=load)
    header = {"kind": "api-search", "config": {**asdict(cfg), "seed": seed, "sites": list(model.site_names)},
              "threads": torch.get_num_threads()}
    ckpt = check_resumable(out, resume, overwrite, header) if out is not None else None
    describe = lambda choices: " ".join(model.candidates[c] for c in model.expand(choices))  # noqa: E731
    pieces: list = [Monitor(cfg.steps, hessian, cfg.early_stop == "hessian")]
    checkpointing = None
    if out is not None:
        if ckpt is None:
            prepare_out_dir(out, overwrite or resume)
        checkpointing = Checkpointing(out, checkpoint_every, signals, device, header, last_step=ckpt["step"] if ckpt else None,
                                      resume_hint=resume_hint(out))
        if tensorboard:
            start = ckpt["step"] if ckpt else 0
            pieces.append(TensorBoard(Logger(out, True, purge_step=start + 1 if start else None), out, 10, describe,
                                      intro={"settings": "```\n" + json.dumps(header["config"], indent=1, default=str) + "\n```"}))
    if on_eval is not None:
        pieces.append(EvalHook(on_eval))
    pieces.append(Progress(progress, lambda loop, stats: f"train loss {stats['loss_w']:.3f}"))
    model.train()
    loop = SearchLoop(model, cfg, data, seed=seed, callbacks=pieces, checkpointing=checkpointing, shortlist=shortlist)
    resume_loop(loop, ckpt)
    read_off = loop.run()
    genotype = site_genotype(model, read_off, loop)
    if out is not None:
        genotype.save(out / GENOTYPE_FILE)
    skipped = skipped_lines(loop, read_off)
    for line in skipped:
        print(f"autoln.search: warning: {line}", file=sys.stderr, flush=True)
    notes = skipped + genotype_notes(genotype, seed) + ([unused_note(model.unused_sites)] if model.unused_sites else [])
    if progress:
        for line in notes:
            print(f"autoln.search: note: {line}", file=sys.stderr, flush=True)
    return SearchOutcome(genotype, model, list(loop.state["losses"]), notes)


def skipped_lines(loop, read_off) -> list[str]:
    """The warnings on updates ``on_divergence: skip_batch`` skipped, in the search and in the
    read-off's fine-tuning (:func:`autoln.oneshot.search_loop.skipped_line`), as ``search.py`` gives them."""
    from autoln.oneshot.search_loop import skipped_line

    lines = [skipped_line(loop.state["skipped_batches"], loop.sc.steps),
             skipped_line(read_off.fine_tuning_skipped, read_off.fine_tuning_updates, "fine-tuning updates of the selection")]
    return [line for line in lines if line]


def genotype_notes(genotype: SiteGenotype, seed: int = 0) -> list[str]:
    """The notes ``search.py`` prints on a read-off's weak answers
    (:func:`autoln.oneshot.selection.site_notes`: arbitrary choices, ties of the loss rises and how they
    were broken, rises or scores overruling the largest probability, no clear winner), for a
    site genotype, one line each; the no-clear-winner line says how to check across seeds."""
    from autoln.oneshot.selection import site_notes

    names = list(genotype.sites)
    rises = genotype.provenance.get("loss_rises")
    notes = []
    for kind, line in site_notes(names, genotype.candidates, [genotype.sites[n] for n in names],
                                 np.array([genotype.probabilities[n] for n in names]),
                                 [rises[n] for n in names] if rises else None, scored="search" in genotype.provenance):
        if kind == "undecided":
            line += (f"; check the answer's agreement across seeds: autoln.search(..., seed={seed + 1}) and "
                     f"seed={seed + 2} on fresh models")
        notes.append(line)
    return notes


def site_genotype(model: SearchModel, read_off, loop) -> SiteGenotype:
    """The :class:`SiteGenotype` of a finished loop: per site its row's chosen placement and
    probabilities, with the read-off's details as provenance (loss rises in nats/token per
    site, or the scored genotypes, or the early stop)."""
    rows = model.expand(list(range(len(model.site_names))))
    names = model.module_sites
    probs = [row / row.sum() for row in np.asarray(read_off.probabilities, dtype=np.float64)]  # as search.py's genotype
    provenance: dict[str, Any] = {"steps": loop.sc.steps, "selection": read_off.method, "site_names": list(names),
                                  "skipped_batches": loop.state["skipped_batches"],
                                  "final_train_loss": loop.state["losses"][-1] if loop.state["losses"] else None,
                                  "wall_time_s": round(loop.wall_time(), 2)}
    if read_off.selection is not None:
        provenance["loss_rises"] = {n: [round(float(v), 6) for v in read_off.selection.loss_rises[r]] for n, r in zip(names, rows)}
    if read_off.scored is not None:
        provenance.update({"search": read_off.scored.method, "evaluated": read_off.scored.evaluated, "loss": read_off.scored.loss})
    if read_off.early is not None:
        provenance["early_stop"] = read_off.early
    if loop.state.get("scales"):
        provenance["candidate_scales"] = loop.state["scales"]
    if read_off.shortlist:
        provenance["shortlist"] = [{"sites": {n: model.candidates[g[r]] for n, r in zip(names, rows)}, "loss": round(float(v), 6)}
                                   for g, v in read_off.shortlist]
    return SiteGenotype(list(model.candidates), {n: model.candidates[read_off.choices[r]] for n, r in zip(names, rows)},
                        {n: [float(v) for v in probs[r]] for n, r in zip(names, rows)}, provenance)


def derive(model: nn.Module, genotype: SiteGenotype, deepnorm_weights: Optional[Callable[[str], Iterable[nn.Parameter]]] = None,
           init: bool = True) -> nn.Module:
    """Turn ``model`` (its searched :class:`autoln.models.model.Site` s, or a fresh instance of the
    same class) into the derived model of ``genotype``: each site keeps only its chosen
    placement, with that placement's own norm modules (so a trained supernet's derived model
    computes exactly what the supernet computes with one-hot weights). A :class:`SearchModel`
    is unwrapped. In place; returns the model.

    With ``init`` (a fresh model, to be retrained from scratch) every site that chose DeepNorm
    gets DeepNorm's init gain ``b = (8N)^(-1/4)`` (Wang et al. 2022) on the branch weights
    ``deepnorm_weights(site_name)`` returns: the value and output projections of attention,
    both FFN layers. By default they are found in the site's sibling branch
    (:func:`autoln.space.branches.deepnorm_weights`: ``attn_site`` wraps ``attn``; nanoGPT's value
    third of ``c_attn``, ``c_proj``, ``c_fc``). Use ``init=False`` on a trained model.

    Raises:
        GenotypeError: a site of the genotype that the model lacks, a searched site of the model
            that the genotype lacks, or a placement the site does not offer.
        ValueError: ``init`` with DeepNorm sites whose branch weights cannot be found (pass
            ``deepnorm_weights``); checked before any site is changed.
    """
    if isinstance(model, SearchModel):
        model = model.model
    if not isinstance(model, nn.Module):
        raise ValueError(f"autoln.derive: model: expected the model (an nn.Module with autoln.Site s), got a {type(model).__name__}")
    genotype = as_site_genotype(genotype, "autoln.derive: genotype")
    plain = unwrap(model)
    sites = dict(model_sites(plain))
    chosen = match_sites(genotype.sites, list(sites))
    missing = [n for n in chosen if n not in sites]
    if missing:
        raise GenotypeError(f"the genotype names sites the model lacks: {missing} (the model's sites: {list(sites)})")
    unset = [n for n, s in sites.items() if len(s.placements) > 1 and n not in chosen]
    if unset:
        raise GenotypeError(f"the model's searched sites {unset} have no placement in the genotype")
    deep = [n for n, p in chosen.items() if parse_name(p)[0] == "deepnorm"]
    if deepnorm_weights is None:
        def deepnorm_weights(name: str) -> list[torch.Tensor]:
            return find_deepnorm_weights(plain, name)
    scaled = {name: list(deepnorm_weights(name)) for name in deep} if init else {}
    for name, placement in chosen.items():
        site = sites[name]
        if placement not in site.placements:
            raise GenotypeError(f"site {name!r} offers {list(site.placements)}, not the genotype's {placement!r}")
        site.placements = nn.ModuleDict({placement: site.placements[placement]})
        site.mix = None
        if name in scaled:
            with torch.no_grad():
                for weight in scaled[name]:
                    weight.mul_(site.placements[placement].beta)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model inside the wrappers that prefix its module names: DistributedDataParallel
    and DataParallel (``module.``), ``torch.compile``'s OptimizedModule (``_orig_mod.``); the
    model itself otherwise. Sites are named, and genotypes saved, as the plain model names them."""
    from torch.nn.parallel import DataParallel, DistributedDataParallel

    while True:
        if isinstance(model, (DistributedDataParallel, DataParallel)):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model


def model_sites(model: nn.Module) -> list[tuple[str, Site]]:
    """``(module name, site)`` of every :class:`autoln.models.model.Site` of ``model``, in module
    order; each site learns its name (:attr:`autoln.models.model.Site.name`, for its error messages)."""
    out = [(n, m) for n, m in model.named_modules() if isinstance(m, Site)]
    for n, m in out:
        m.name = n
    return out


def match_sites(chosen: dict[str, str], names: Sequence[str]) -> dict[str, str]:
    """``chosen`` (site name -> placement) keyed by the model's site ``names``: as it is when
    every name is the model's, else with one common prefix removed from or added to its names
    (a genotype saved from a model under a wrapper of its own, ``module.``...), when that makes
    every name the model's; else as it is (the caller names the misfit)."""
    if all(n in names for n in chosen) or not chosen:
        return chosen
    first = next(iter(chosen))
    for name in names:
        if name.endswith("." + first):  # the model is wrapped, the genotype's names are plain
            prefix = name[:-len(first)]
            if all(prefix + n in names for n in chosen):
                return {prefix + n: p for n, p in chosen.items()}
        if first.endswith("." + name):  # the genotype's names carry a wrapper's prefix
            prefix = first[:-len(name)]
            if all(n.startswith(prefix) and n[len(prefix):] in names for n in chosen):
                return {n[len(prefix):]: p for n, p in chosen.items()}
    return chosen


def load_derived(run_dir: str | Path, device: str | torch.device = "cpu") -> TransformerLM:
    """The derived model of a finished ``retrain.py`` run, as a plain ``nn.Module`` in eval mode:
    autoln's :class:`autoln.models.model.TransformerLM` built from the run's genotype and config, with
    the weights of its last step (``checkpoint.pt``). Call it on token ids ``(B, T)`` for
    ``(logits (B, T, V), None)``, or with targets for the loss in nats per token; fine-tune it
    with any optimizer.

    Raises:
        OutputError: ``run_dir`` holds no finished retrain (``metrics.json`` and
            ``checkpoint.pt``), or its checkpoint is unreadable or of a search.
    """
    from autoln.config import Config, with_defaults
    from autoln.models.genotype import Genotype
    from autoln.models.model import build_derived

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
