"""``autoln.derive`` and ``autoln.load_derived``: the derived model.

- :func:`derive` keeps each site's chosen placement (a searched model becomes its derived
  model, exactly: the one-hot equivalence), and on a fresh model applies DeepNorm's init gain
  to the branch weights the user names.
- :func:`load_derived` loads a finished ``retrain.py`` run of autoln's own model back as a
  plain ``nn.Module``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterable, Optional

import torch
from torch import nn

from autoln.api.search_model import SearchModel
from autoln.api.site_genotype import SiteGenotype, as_site_genotype
from autoln.api.sites import match_sites, model_qk_norms, model_sites, unwrap
from autoln.core.errors import GenotypeError, OutputError
from autoln.models.model import TransformerLM
from autoln.models.qk_norm import QKNorm
from autoln.models.site import hold_for_backward
from autoln.space.branches import deepnorm_weights as find_deepnorm_weights
from autoln.space.branches import scale_once
from autoln.space.placements import parse_name


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
    third of ``c_attn``, ``c_proj``, ``c_fc``). Each weight gets the gain once: a branch module
    that several blocks share (their sites each wrap it), or a tensor that ``deepnorm_weights``
    returns for several sites, is scaled by ``b``, not ``b`` per site
    (:func:`autoln.space.branches.scale_once`). Use ``init=False`` on a trained model.

    Raises:
        GenotypeError: a site of the genotype that the model lacks, a searched site of the model
            that the genotype lacks, or a placement the site does not offer; the same for the
            model's :class:`autoln.QKNorm` s and the genotype's QK-norm choices (``qk``), which
            are kept as the sites are.
        ValueError: ``init`` with DeepNorm sites whose branch weights cannot be found (pass
            ``deepnorm_weights``), or one weight shared by sites of different gains (different
            ``n_layers``); checked before any site is changed.
    """
    if isinstance(model, SearchModel):
        model = model.model
    if not isinstance(model, nn.Module):
        raise ValueError(f"autoln.derive: model: expected the model (an nn.Module with autoln.Site s), got a {type(model).__name__}")
    genotype = as_site_genotype(genotype, "autoln.derive: genotype")
    plain = unwrap(model)
    sites = dict(model_sites(plain))
    chosen = match_sites(genotype.sites, list(sites))
    check_choices(chosen, {n: list(s.placements) for n, s in sites.items()}, ("site", "sites"), "placement")
    deep = [n for n, p in chosen.items() if parse_name(p)[0] == "deepnorm"]
    if deepnorm_weights is None:
        def deepnorm_weights(name: str) -> list[torch.Tensor]:
            return find_deepnorm_weights(plain, name)
    scaled = {name: list(deepnorm_weights(name)) for name in deep} if init else {}
    qk_chosen = check_qk(plain, genotype)
    claims = [(name, w, sites[name].placements[chosen[name]].beta) for name, weights in scaled.items() for w in weights]
    scale_once(claims)  # checks every claim before it changes a weight
    for name, placement in chosen.items():
        site = sites[name]
        site.placements = nn.ModuleDict({placement: site.placements[placement]})
        site.mix = None
        hold_for_backward(site, None)
    for qk, choice in qk_chosen:
        keep(qk, choice)
    return model


def check_choices(chosen: dict[str, str], offered: dict[str, list[str]], kind: tuple[str, str], what: str,
                  hint: str = "") -> None:
    """Check a genotype's ``chosen`` option per module name against the model's ``offered`` options
    per module name (its sites' placements, or its QK-norms' candidates); ``kind`` names one and
    several such modules (``("site", "sites")``), ``what`` the genotype's entry and ``hint`` where
    the genotype keeps it.

    Raises:
        GenotypeError: a module of the genotype the model lacks, a searched module of the model
            (more than one option) the genotype gives no choice for, or a choice its module does
            not offer."""
    one, many = kind
    missing = [n for n in chosen if n not in offered]
    if missing:
        raise GenotypeError(f"the genotype names {many} the model lacks: {missing} (the model's {many}: {list(offered)})")
    unset = [n for n, options in offered.items() if len(options) > 1 and n not in chosen]
    if unset:
        raise GenotypeError(f"the model's searched {many} {unset} have no {what} in the genotype{hint}")
    for name, choice in chosen.items():
        if choice not in offered[name]:
            raise GenotypeError(f"{one} {name!r} offers {offered[name]}, not the genotype's {choice!r}")


def check_qk(model: nn.Module, genotype: SiteGenotype) -> list[tuple[QKNorm, str]]:
    """The QK-norms of ``model`` that :func:`derive` fixes, with their choice in ``genotype``:
    every QK-norm the genotype names (by module name, a wrapper's prefix matched as for the
    sites), checked before anything changes.

    Raises:
        GenotypeError: a QK-norm of the genotype the model lacks, a searched QK-norm of the model
            the genotype gives no choice for, a choice the QK-norm does not offer."""
    qks = dict(model_qk_norms(model))
    chosen = match_sites(genotype.qk, list(qks)) if genotype.qk else {}
    check_choices(chosen, {n: list(m.candidates) for n, m in qks.items()}, ("QK-norm", "QK-norms"), "choice",
                  " (its field qk_norm)")
    return [(qks[n], c) for n, c in chosen.items()]


def keep(qk: QKNorm, choice: str) -> None:
    """Leave ``qk`` with the one candidate ``choice`` and its own norms (the derived model's QK-norm)."""
    qk.candidates = [choice]
    qk.q_norms = nn.ModuleDict({c: m for c, m in qk.q_norms.items() if c == choice})
    qk.k_norms = nn.ModuleDict({c: m for c, m in qk.k_norms.items() if c == choice})
    qk.mix = None
    hold_for_backward(qk, None)


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
    model = build_derived(mc, genotype.model["vocab_size"], genotype.block_placements(), genotype.qk_choices())
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval()
