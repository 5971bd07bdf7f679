"""``autoln.map_state_dict``: a plain model's weights into the model with sites, and a derived
model's back out.

The README's change to a block renames its norms: nanoGPT's ``transformer.h.0.ln_1.weight`` is
``transformer.h.0.attn_site.placements.pre.norm.weight`` once ``ln_1`` is the norm of the site
``attn_site``. A checkpoint of the unchanged model (nanoGPT's ``ckpt.pt``, the weights
``GPT.from_pretrained`` loads) then fits the changed model only through a key map built from the
sites' names, which :func:`map_state_dict` applies, both ways (wandering007/nasnet-pytorch#3:
``strict=False`` would load without a word and leave the norms' gains at their start).
"""

from __future__ import annotations

from typing import Any, Mapping

from torch import nn

from autoln.api.search_model import SearchModel
from autoln.api.sites import model_sites, unwrap
from autoln.core.errors import cut

WHERE = "autoln.map_state_dict"


def norm_key_map(model: nn.Module, norms: Mapping[str, str], placement: str, derived: bool) -> tuple[dict[str, str], list[str]]:
    """``({plain model's key: model's key}, the sites' names)``: for each site ``<parent>.<s>`` of
    ``model`` with ``norms[n] == s``, the keys of the norm ``<parent>.<n>`` map to those of the
    site's ``placement``'s norm ``<parent>.<s>.placements.<placement>.norm``.

    Raises:
        ValueError: ``norms`` not a mapping of names, a site in none of its entries or an
            entry naming no site, a site without ``placement`` (or with other placements too,
            when ``derived``)."""
    if not isinstance(norms, Mapping) or not norms or not all(isinstance(k, str) and isinstance(v, str) for k, v in norms.items()):
        raise ValueError(f"{WHERE}: norms: expected the plain model's norm names and their sites' names, e.g. "
                         f"{{'ln_1': 'attn_site', 'ln_2': 'mlp_site'}} for nanoGPT, got {cut(repr(norms))}")
    site_of = {site: norm for norm, site in norms.items()}
    sites = model_sites(model)
    last = {name.rpartition(".")[2] for name, _ in sites}
    unused = [s for s in site_of if s not in last]
    if unused:
        raise ValueError(f"{WHERE}: norms: {unused} name no site of the model (its sites end in {sorted(last)})")
    table: dict[str, str] = {}
    for name, site in sites:
        parent, _, own = name.rpartition(".")
        if own not in site_of:
            raise ValueError(f"{WHERE}: the site {name!r} is in no entry of norms: name the plain model's norm it replaces, "
                             f"e.g. norms={{..., 'ln_x': {own!r}}}")
        check_placement(name, list(site.placements), placement, derived)
        plain = (parent + "." if parent else "") + site_of[own] + "."
        inner = f"{name}.placements.{placement}.norm."
        for key in site.placements[placement].norm.state_dict():
            table[plain + key] = inner + key
    return table, [name for name, _ in sites]


def check_placement(name: str, held: list[str], placement: str, derived: bool) -> None:
    """Refuse a site that cannot take (or, ``derived``, give) the plain norm of ``placement``.

    Raises:
        ValueError: naming the site and its placements ``held``."""
    if not derived and placement not in held:
        raise ValueError(f"{WHERE}: the site {name!r} offers {held}, not placement={placement!r} (the placement of the plain "
                         "model's norms)")
    if derived and placement in held and held != [placement]:
        raise ValueError(f"{WHERE}: the site {name!r} holds {held}: autoln.derive the model first (only one placement's norm "
                         "has a place in the plain model)")
    if derived and placement not in held:
        raise ValueError(f"{WHERE}: the site {name!r} is derived to {held[0]!r}, which the plain model (its norms at "
                         f"placement={placement!r}) cannot compute; only a site derived to {placement!r} maps out")


def map_state_dict(state_dict: Mapping[str, Any], model: nn.Module, norms: Mapping[str, str], *, to_plain: bool = False,
                   placement: str = "pre") -> dict[str, Any]:
    """A plain model's state dict for ``model``, the same model with :class:`autoln.Site` s (or
    with ``to_plain`` a derived model's state dict for the plain model), to load with
    ``load_state_dict``'s default ``strict=True``.

    ``norms`` names the plain model's norm each site replaces, by last name within one parent
    module: nanoGPT changed as the README shows has ``{"ln_1": "attn_site", "ln_2":
    "mlp_site"}``; ``transformer.h.0.ln_1.weight`` ``(d,)`` is then
    ``transformer.h.0.attn_site.placements.pre.norm.weight``. Every other key is the same in
    both models and kept as it is (the tensors are not copied; ``load_state_dict`` copies). A
    prefix that every key of a plain state dict carries, ``torch.compile``'s ``_orig_mod.`` (in
    nanoGPT's ``ckpt.pt`` of a compiled model) or DDP's ``module.``, is removed.

    Into ``model`` (``to_plain`` False): each plain norm fills the norm of the site's
    ``placement`` (default ``pre``: GPT-2's, nanoGPT's, LLaMA's own), which every site must
    offer; a supernet site's other candidates (``post``'s and ``deepnorm``'s own norms) have
    no counterpart in the plain model and keep ``model``'s values (their start). Out of a
    derived ``model`` (``to_plain`` True; ``state_dict`` is its own): each site must hold
    ``placement`` alone, whose norm becomes the plain model's (a site derived to another
    placement computes what the plain model cannot).

    Returns:
        ``{key: tensor}`` in ``model``'s key order (into it) or in ``state_dict``'s (out).

    Raises:
        ValueError: one line naming the key or the site: a key that fits no key of the model
            (nor maps to one), a key of the model the state dict lacks, a shape that differs
            from the model's, a site out of ``norms``, a site without ``placement`` (or, out, a
            site holding other placements: derive it first), a site key that maps to no plain key.
    """
    if isinstance(model, SearchModel):
        model = model.model
    if not isinstance(model, nn.Module):
        raise ValueError(f"{WHERE}: model: expected the model with autoln.Site s (an nn.Module), got a {type(model).__name__}")
    if not isinstance(state_dict, Mapping):
        raise ValueError(f"{WHERE}: state_dict: expected a mapping of key -> tensor (model.state_dict()), got a "
                         f"{type(state_dict).__name__}")
    model = unwrap(model)
    table, sites = norm_key_map(model, norms, placement, derived=to_plain)
    own = model.state_dict(keep_vars=True)
    if to_plain:
        return plain_state(state_dict, table, sites)
    state_dict = unprefixed(state_dict)
    out: dict[str, Any] = {}
    norm_of = {k.rpartition(".")[0] + ".": v.rpartition(".")[0] + "." for k, v in table.items()}  # plain norm -> site's norm
    for key, value in state_dict.items():
        prefix = next((p for p in norm_of if key.startswith(p)), None)
        target = key if prefix is None else norm_of[prefix] + key[len(prefix):]
        if target not in own:
            raise ValueError(f"{WHERE}: the state dict's key {cut(key)!r} fits no key of the model" + (
                f" (it maps to {target!r}, which the model lacks: build the sites as the plain norms are, e.g. bias=...)"
                if prefix is not None else misfit_hint(key, state_dict)))
        if tuple(getattr(value, "shape", ())) != tuple(own[target].shape):
            raise ValueError(f"{WHERE}: the state dict's {key!r} has shape {tuple(getattr(value, 'shape', ()))}, the model's "
                             f"{target!r} {tuple(own[target].shape)}: a model of another size")
        out[target] = value
    return fill_rest(out, own, table, sites)


#: The prefixes wrappers put before every key: torch.compile's and DDP's.
WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def unprefixed(state_dict: Mapping[str, Any]) -> Mapping[str, Any]:
    """``state_dict`` without the wrapper prefixes (:data:`WRAPPER_PREFIXES`) that every one of
    its keys carries (nanoGPT's ``ckpt.pt`` of a compiled model: ``_orig_mod.transformer...``);
    as it is otherwise."""
    while state_dict and (p := next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in state_dict)), None)):
        state_dict = {k[len(p):]: v for k, v in state_dict.items()}
    return state_dict


def misfit_hint(key: str, state_dict: Mapping[str, Any]) -> str:
    """Why a plain state dict's ``key`` fits nothing, when it can be told: a whole checkpoint, a wrapper's prefix."""
    if isinstance(state_dict.get("model"), Mapping):
        return ": this is a checkpoint holding a state dict; pass its state dict, e.g. ckpt['model']"
    if key.startswith(WRAPPER_PREFIXES):
        return f": it carries a wrapper's prefix {key.split('.')[0] + '.'!r} (torch.compile's, DDP's) that other keys lack"
    return ""


def fill_rest(out: dict[str, Any], own: Mapping[str, Any], table: Mapping[str, str], sites: list[str]) -> dict[str, Any]:
    """``out`` (the plain state dict's keys, mapped) completed to every key of the model, in its
    order: a key whose tensor is one ``out`` already holds under another name (a norm two
    candidates share) takes that value; a site's other candidates' keys take the model's own.

    Raises:
        ValueError: a key of the model outside the sites' other candidates that ``out`` lacks."""
    filled = {id(own[k]): v for k, v in out.items()}
    mapped = set(table.values())
    plain_of = {v: k for k, v in table.items()}
    for key, tensor in own.items():
        if key in out:
            continue
        if id(tensor) in filled:
            out[key] = filled[id(tensor)]
        elif key in mapped:
            raise ValueError(f"{WHERE}: the state dict lacks {plain_of[key]!r}, the plain model's norm that the model's "
                             f"{key!r} takes")
        elif any(key.startswith(s + ".placements.") for s in sites):
            out[key] = tensor.detach()  # another candidate's own: the plain model has none
        else:
            raise ValueError(f"{WHERE}: the state dict lacks the model's key {key!r} (a plain model of another kind, or "
                             "of another configuration)")
    return {k: out[k] for k in own}


def plain_state(state_dict: Mapping[str, Any], table: Mapping[str, str], sites: list[str]) -> dict[str, Any]:
    """A derived model's ``state_dict`` with each site's norm under the plain model's name.

    Raises:
        ValueError: a key of a site that maps to no key of the plain model."""
    inverse = {v: k for k, v in table.items()}
    out: dict[str, Any] = {}
    for key, value in state_dict.items():
        if key in inverse:
            out[inverse[key]] = value
        elif any(key.startswith(s + ".") for s in sites):
            raise ValueError(f"{WHERE}: the model's key {cut(key)!r} maps to no key of the plain model (only the norm of each "
                             "site's placement has a plain counterpart)")
        else:
            out[key] = value
    return out
