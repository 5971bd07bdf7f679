"""The branch weights DeepNorm's init gain scales, found in a user's block (for :func:`autoln.derive`).

DeepNorm (Wang et al. 2022, "DeepNet: Scaling Transformers to 1,000 Layers", Alg. 1 and
torchscale's ``reset_parameters``) starts the derived model's branches with the gain ``b`` on
the attention's value and output projections and on both FFN layers, never on the query and key
projections. In a block changed as the README shows, the site ``<prefix>.attn_site`` wraps the
sibling module ``<prefix>.attn`` and ``<prefix>.mlp_site`` wraps ``<prefix>.mlp`` (any
``X_site`` wraps ``X``); :func:`deepnorm_weights` reads those weights off the sibling:

- a fused query-key-value ``nn.Linear`` ``(3d, d)`` named as in :data:`FUSED_QKV_NAMES`
  (nanoGPT's ``c_attn``, timm's ``qkv``): its value third, rows ``2d:3d``
  (``q, k, v = c_attn(x).split(d, dim=2)``);
- an ``nn.MultiheadAttention``: the value rows of ``in_proj_weight`` (or ``v_proj_weight``) and
  ``out_proj.weight``;
- every other ``nn.Linear`` weight except query and key projections (named ``q``, ``k``,
  ``q_proj``, ``k_proj``, ``query``, ``key``, ``wq``, ``wk``, ``to_q``, ``to_k``): nanoGPT's
  ``attn.c_proj``, ``mlp.c_fc`` and ``mlp.c_proj``; LLaMA's ``wv``, ``wo``, ``w1``, ``w2``, ``w3``.

A branch module shared by several blocks (one ``attn`` called by every block, as ALBERT shares
its layers) is found under each of its names, and :func:`scale_once` gives each of its weights
the gain once, however many DeepNorm sites return it.
"""

from __future__ import annotations

import torch
from torch import nn

#: Last name parts of query and key projections, which DeepNorm's gain leaves alone.
QUERY_KEY_NAMES = frozenset({"q", "k", "q_proj", "k_proj", "query", "key", "wq", "wk", "to_q", "to_k"})
#: Last name parts of fused query-key-value projections ``(3d, d)``, whose value third is scaled.
FUSED_QKV_NAMES = frozenset({"c_attn", "qkv", "wqkv", "qkv_proj", "in_proj", "query_key_value"})
SITE_SUFFIX = "_site"


def branch_of(model: nn.Module, site_name: str) -> tuple[str, nn.Module]:
    """``(name, module)`` of the branch the site ``site_name`` wraps: its sibling named as the
    site without ``_site`` (``transformer.h.0.attn_site`` -> ``transformer.h.0.attn``), under any
    of its names: a module shared by several blocks is the sibling of each block's site.

    Raises:
        ValueError: the site's name does not end in ``_site``, or the model has no such sibling
            module; the line says to name the weights with ``deepnorm_weights=``."""
    modules = dict(model.named_modules(remove_duplicate=False))  # a shared module under each of its names
    if not site_name.endswith(SITE_SUFFIX) or site_name[:-len(SITE_SUFFIX)] not in modules:
        raise ValueError(f"DeepNorm's init gain: cannot find the branch of site {site_name!r} (a site 'X_site' is read as "
                         f"wrapping its sibling module 'X'); name its weights: autoln.derive(model, genotype, "
                         f"deepnorm_weights=lambda site: [...value, output and FFN weights...])")
    name = site_name[:-len(SITE_SUFFIX)]
    return name, modules[name]


def deepnorm_weights(model: nn.Module, site_name: str) -> list[torch.Tensor]:
    """The weights of the branch of ``site_name`` that DeepNorm's init gain ``b`` multiplies
    (see the module's docstring for the rule), as views that an in-place ``mul_`` changes:
    for nanoGPT's ``attn_site`` the value rows ``(d, d)`` of ``c_attn.weight`` ``(3d, d)`` and
    ``c_proj.weight`` ``(d, d)``; for its ``mlp_site`` ``c_fc.weight`` ``(4d, d)`` and
    ``c_proj.weight`` ``(d, 4d)``.

    Raises:
        ValueError: no branch found (:func:`branch_of`), or a branch holding no linear weight
            the rule takes; the line names the site and says how to name the weights instead."""
    branch_name, branch = branch_of(model, site_name)
    found: list[torch.Tensor] = []
    inside_mha: set[str] = set()
    for name, m in branch.named_modules():
        if isinstance(m, nn.MultiheadAttention):
            inside_mha.add(name + ".out_proj" if name else "out_proj")
            d = m.embed_dim
            found.append(m.in_proj_weight[2 * d:] if m.in_proj_weight is not None else m.v_proj_weight)
            found.append(m.out_proj.weight)
    for name, m in branch.named_modules():
        if not isinstance(m, nn.Linear) or name in inside_mha:
            continue
        if name.split(".")[-1].lower() in QUERY_KEY_NAMES:
            continue
        fused = m.out_features == 3 * m.in_features and name.split(".")[-1].lower() in FUSED_QKV_NAMES
        found.append(m.weight[2 * m.in_features:] if fused else m.weight)
    if not found:
        raise ValueError(f"DeepNorm's init gain: the branch {branch_name!r} of site {site_name!r} holds no nn.Linear weight "
                         f"to scale; name them: autoln.derive(model, genotype, deepnorm_weights=lambda site: [...])")
    return found


def scale_once(claims: list[tuple[str, torch.Tensor, float]]) -> None:
    """Multiply each weight of ``claims`` (``(site name, weight or view, gain)``, in order) by its
    site's DeepNorm gain ``b``, every element once: a weight (or an overlapping view of it) that
    several sites return, because they share one branch module or the caller named the same
    tensor twice, is scaled by ``b``, not ``b`` to the power of the number of sites (DeepNet's
    initialisation scales each of a branch's value, output and FFN weights once). In place,
    under ``torch.no_grad``.

    Raises:
        ValueError: two sites with different gains (different ``n_layers``) claim one element;
            checked before any weight is changed."""
    seen: dict[tuple, tuple[torch.Tensor, str, float]] = {}  # storage -> (element mask, first site, its gain)
    plan = []
    for site, weight, gain in claims:
        storage = weight.untyped_storage()
        key = (weight.device, storage.data_ptr())
        if key not in seen:
            seen[key] = (torch.zeros(storage.nbytes() // weight.element_size(), dtype=torch.bool, device=weight.device), site, gain)
        mask, first, first_gain = seen[key]
        marks = mask.as_strided(weight.shape, weight.stride(), weight.storage_offset())
        if bool(marks.any()) and abs(gain - first_gain) > 1e-12 * max(abs(gain), abs(first_gain)):
            raise ValueError(f"DeepNorm's init gain: sites {first!r} and {site!r} share a branch weight {tuple(weight.shape)} but "
                             f"not their gain ({first_gain:.6g} against {gain:.6g}: different n_layers); give both sites the "
                             "model's number of blocks N")
        plan.append((weight, gain, marks.clone()))
        marks.fill_(True)
    with torch.no_grad():
        for weight, gain, done in plan:
            if not bool(done.any()):
                weight.mul_(gain)
            elif not bool(done.all()):
                weight.mul_(torch.where(done, torch.ones((), dtype=weight.dtype, device=weight.device),
                                        torch.full((), gain, dtype=weight.dtype, device=weight.device)))
