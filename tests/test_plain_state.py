"""A plain model's weights into the model with sites and a derived model's back out
(wandering007/nasnet-pytorch#3): ``autoln.map_state_dict`` maps nanoGPT's ``ln_1``/``ln_2`` keys to
the sites' norms, so that a checkpoint of the unchanged ``model.py`` (``ckpt.pt``, what
``from_pretrained`` loads) loads strictly into the changed one and computes the same, and a
model derived to Pre-LN loads back into the unchanged file; what cannot be mapped is named in one line."""

from __future__ import annotations

import pytest
import torch

import autoln

from .test_nanogpt_diff import EXAMPLE, NANOGPT, SIZE, load

NORMS = {"ln_1": "attn_site", "ln_2": "mlp_site"}
CANDS = ("pre", "post", "deepnorm")


@pytest.fixture(scope="module")
def gpts():
    return load(NANOGPT, "nanogpt_plain_state"), load(EXAMPLE, "gpt_plain_state")


def _plain(gpts, bias=True):
    torch.manual_seed(0)
    model = gpts[0].GPT(gpts[0].GPTConfig(**SIZE, bias=bias))
    with torch.no_grad():  # trained norms: gains and biases away from their start
        for name, p in model.named_parameters():
            if ".ln_" in name:
                p.add_(0.3 * torch.randn_like(p))
    return model


def _patched(gpts, cands=CANDS, bias=True, seed=1):
    torch.manual_seed(seed)
    return gpts[1].GPT(gpts[1].GPTConfig(**SIZE, bias=bias, norm_candidates=cands))


def _xy():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, SIZE["vocab_size"], (2, 16), generator=g), torch.randint(0, SIZE["vocab_size"], (2, 16), generator=g)


@pytest.mark.parametrize("bias", [True, False])
def test_a_plain_checkpoint_loads_strictly_into_the_changed_model_and_computes_the_same(gpts, bias):
    plain, patched = _plain(gpts, bias), _patched(gpts, ("pre",), bias)
    given = plain.state_dict()
    state = autoln.map_state_dict(given, patched, NORMS)
    assert state["transformer.h.0.attn_site.placements.pre.norm.weight"] is given["transformer.h.0.ln_1.weight"]
    patched.load_state_dict(state)  # strict
    x, y = _xy()
    plain.eval(), patched.eval()
    with torch.no_grad():
        assert torch.equal(patched(x, y)[1], plain(x, y)[1])


def test_a_compiled_model_s_checkpoint_loses_its_prefix(gpts):
    plain, supernet = _plain(gpts), _patched(gpts)
    want = autoln.map_state_dict(plain.state_dict(), supernet, NORMS)
    got = autoln.map_state_dict({"_orig_mod." + k: v for k, v in plain.state_dict().items()}, supernet, NORMS)  # nanoGPT's ckpt.pt
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)


def test_a_plain_checkpoint_starts_a_supernet_whose_pre_candidate_is_the_plain_model(gpts):
    plain, supernet = _plain(gpts), _patched(gpts)
    start = {k: v.clone() for k, v in supernet.state_dict().items()}
    supernet.load_state_dict(autoln.map_state_dict(plain.state_dict(), supernet, NORMS))
    got = supernet.state_dict()
    assert torch.equal(got["transformer.h.2.mlp_site.placements.pre.norm.bias"], plain.state_dict()["transformer.h.2.ln_2.bias"])
    assert torch.equal(got["transformer.h.2.mlp_site.placements.post.norm.weight"], start["transformer.h.2.mlp_site.placements.post.norm.weight"])
    net = autoln.SearchModel(supernet).eval()
    x, y = _xy()
    with torch.no_grad():
        one_hot = torch.tensor([[1.0, 0.0, 0.0]] * len(net.site_names))
        torch.testing.assert_close(net(x, y, mix=one_hot)[1], plain.eval()(x, y)[1], rtol=0, atol=1e-6)


def test_a_model_derived_to_pre_loads_back_into_the_plain_model(gpts):
    supernet = _patched(gpts)
    with torch.no_grad():
        for p in supernet.parameters():
            p.add_(0.1 * torch.randn_like(p))
    sites = autoln.SearchModel(supernet).site_names
    derived = autoln.derive(supernet, autoln.SiteGenotype(list(CANDS), {s: "pre" for s in sites}, {s: [1.0, 0, 0] for s in sites}),
                            init=False)
    plain = _plain(gpts)
    out = autoln.map_state_dict(derived.state_dict(), derived, NORMS, to_plain=True)
    assert list(out) == list(plain.state_dict())
    plain.load_state_dict(out)  # strict
    x, y = _xy()
    with torch.no_grad():
        assert torch.equal(plain.eval()(x, y)[1], derived.eval()(x, y)[1])


def test_what_cannot_be_mapped_is_named_in_one_line(gpts):
    plain, supernet = _plain(gpts), _patched(gpts)
    state = plain.state_dict()
    sites = autoln.SearchModel(supernet).site_names
    cases = [
        (dict(state_dict={**state, "foo.weight": torch.zeros(1)}, model=supernet),
         r"^autoln.map_state_dict: the state dict's key 'foo.weight' fits no key of the model$"),
        (dict(state_dict={"model": state, "iter_num": 5}, model=supernet),
         r"key 'model' fits no key of the model: this is a checkpoint holding a state dict; pass its state dict, e.g. ckpt\['model'\]$"),
        (dict(state_dict={**state, "_orig_mod.lm_head.weight": state["lm_head.weight"]}, model=supernet),
         r"key '_orig_mod.lm_head.weight' fits no key of the model: it carries a wrapper's prefix '_orig_mod.' \(torch.compile's, "
         r"DDP's\) that other keys lack$"),
        (dict(state_dict={k: v for k, v in state.items() if k != "transformer.h.1.ln_2.weight"}, model=supernet),
         r"^autoln.map_state_dict: the state dict lacks 'transformer.h.1.ln_2.weight', the plain model's norm that the model's "
         r"'transformer.h.1.mlp_site.placements.pre.norm.weight' takes$"),
        (dict(state_dict=state, model=_patched(gpts, bias=False)),
         r"key 'transformer.h.0.ln_1.bias' fits no key of the model \(it maps to 'transformer.h.0.attn_site.placements.pre.norm.bias', "
         r"which the model lacks"),
        (dict(state_dict={**state, "transformer.h.0.ln_1.weight": torch.ones(8)}, model=supernet),
         r"^autoln.map_state_dict: the state dict's 'transformer.h.0.ln_1.weight' has shape \(8,\), the model's "
         r"'transformer.h.0.attn_site.placements.pre.norm.weight' \(32,\): a model of another size$"),
        (dict(state_dict=state, model=supernet, norms={"ln_1": "attn_site"}),
         r"^autoln.map_state_dict: the site 'transformer.h.0.mlp_site' is in no entry of norms"),
        (dict(state_dict=state, model=_patched(gpts, ("post", "deepnorm"))),
         r"the site 'transformer.h.0.attn_site' offers \['post', 'deepnorm'\], not placement='pre'"),
        (dict(state_dict=supernet.state_dict(), model=supernet, to_plain=True),
         r"the site 'transformer.h.0.attn_site' holds \['pre', 'post', 'deepnorm'\]: autoln.derive the model first"),
    ]
    post = autoln.derive(_patched(gpts), autoln.SiteGenotype(list(CANDS), {s: "post" for s in sites}, {s: [0, 1.0, 0] for s in sites}))
    cases.append((dict(state_dict=post.state_dict(), model=post, to_plain=True),
                  r"the site 'transformer.h.0.attn_site' is derived to 'post', which the plain model \(its norms at placement='pre'\) "
                  r"cannot compute; only a site derived to 'pre' maps out$"))
    for kwargs, match in cases:
        kwargs.setdefault("norms", NORMS)
        with pytest.raises(ValueError, match=match) as info:
            autoln.map_state_dict(**kwargs)
        assert "\n" not in str(info.value)
