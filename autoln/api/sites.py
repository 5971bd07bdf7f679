"""The sites of a user's model, and the checks of what a user passes the API.

:class:`autoln.models.model.Site` (exported as ``autoln.Site``) wraps one sublayer of the user's
block: ``x = x + self.attn(self.ln_1(x))`` becomes ``x = self.attn_site(x, self.attn)``. A site
with several candidates is a supernet site; with one, a derived model's sublayer. Candidates
are the registry of :mod:`autoln.space.placements`. Here: finding the sites (through DDP,
DataParallel and ``torch.compile`` wrappers), matching a genotype's site names to the model's,
and the one-line refusals of a builder, a list of names, an evaluation's value or a batch.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
from torch import nn

from autoln.core.errors import cut
from autoln.models.site import Site


def searchable_sites(model: nn.Module) -> list[tuple[str, Site]]:
    """``(module name, site)`` of every :class:`autoln.models.model.Site` of ``model`` with two or more
    candidates, in module order (the order of the alpha rows); names as the plain model inside
    a DDP, DataParallel or ``torch.compile`` wrapper gives them (:func:`unwrap`)."""
    return [(name, m) for name, m in model_sites(unwrap(model)) if len(m.placements) > 1]


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


def model_qk_norms(model: nn.Module) -> list[tuple[str, "QKNorm"]]:
    """``(module name, QK-norm)`` of every :class:`autoln.models.qk_norm.QKNorm` of ``model``
    (unwrapped, :func:`unwrap`), in module order; each learns its name (for its error messages)."""
    from autoln.models.qk_norm import QKNorm

    out = [(n, m) for n, m in unwrap(model).named_modules() if isinstance(m, QKNorm)]
    for n, m in out:
        m.name = n
    return out


def searchable_qk_norms(model: nn.Module) -> list[tuple[str, "QKNorm"]]:
    """The QK-norms of :func:`model_qk_norms` with two or more candidates (the searched ones)."""
    return [(n, m) for n, m in model_qk_norms(model) if len(m.candidates) > 1]


def plain_qk_choices(model: nn.Module) -> tuple[dict[str, str], list[str], dict[str, list[float]]]:
    """The QK-norm part of a named placement without QK-norm of its own (``all-pre``, ``mix-ln``)
    for ``model``'s searched QK-norms: ``(choices, candidates, probabilities)``, each choice
    ``none`` where it is a candidate, else the first (:func:`autoln.space.qk.plain_qk`); empty
    without a searched QK-norm."""
    from autoln.space.qk import plain_qk

    qks = searchable_qk_norms(model)
    if not qks:
        return {}, [], {}
    cands = list(qks[0][1].candidates)
    return qk_one_hot({n: plain_qk(cands) for n, _ in qks}, cands)


def qk_one_hot(choices: dict[str, str], cands: Sequence[str]) -> tuple[dict[str, str], list[str], dict[str, list[float]]]:
    """``(choices, candidates, one-hot probabilities)`` of a site genotype's QK-norm part."""
    return dict(choices), list(cands), {n: [1.0 if c == ch else 0.0 for c in cands] for n, ch in choices.items()}


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


def check_build(build: Any, where: str) -> None:
    """Refuse a ``build`` that is not a function returning a fresh model.

    Raises:
        ValueError: naming ``where``: a model given instead of a builder, or not callable."""
    if isinstance(build, nn.Module):
        raise ValueError(f"{where}: build: expected a function that returns a fresh model, e.g. lambda: GPT(GPTConfig(...)), "
                         f"got a {type(build).__name__} model (every run starts from a new one)")
    if not callable(build):
        raise ValueError(f"{where}: build: expected a function that returns a fresh model, got a {type(build).__name__}")


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


def as_pair(batch, what: str, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` as an ``(x, y)`` pair of tensors.

    Raises:
        ValueError: naming ``what`` and the batch's 0-based ``index``: not a pair of tensors."""
    if isinstance(batch, (tuple, list)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch):
        return batch[0], batch[1]
    kind = type(batch).__name__ + (f" of {len(batch)}" if isinstance(batch, (tuple, list)) else "")
    raise ValueError(f"{what}: batch {index} is a {kind}, expected an (x, y) pair of tensors (token ids and targets, (B, T) each)")
