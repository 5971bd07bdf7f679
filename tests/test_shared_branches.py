"""DeepNorm's init gain on a model whose blocks share their branch modules (ALBERT's cross-layer
sharing): ``autoln.derive`` finds a shared branch under every block's name and scales each of
its weights by ``b`` once, for every way :func:`autoln.deepnorm_weights` finds a branch's
weights (nanoGPT's fused ``c_attn`` and its linears, ``nn.MultiheadAttention``'s packed and
separate value projections, LLaMA's ``wv``/``wo``) and for weights the caller names; sites of
different gains sharing a weight are refused in one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autoln
from autoln.space.placements import deepnorm_constants

from .conftest import ROOT
from .test_nanogpt_diff import load

SIZE = dict(block_size=16, vocab_size=48, n_layer=3, n_head=2, n_embd=32)


def _all(model, placement: str, cands=("pre", "post", "deepnorm")) -> autoln.SiteGenotype:
    names = [n for n, m in model.named_modules() if isinstance(m, autoln.Site)]
    k = list(cands).index(placement)
    return autoln.SiteGenotype(list(cands), {n: placement for n in names}, {n: [float(i == k) for i in range(len(cands))] for n in names})


def _shared_gpt():
    """nanoGPT changed as the README shows, its three blocks sharing block 0's attn and mlp."""
    gpt = load(ROOT / "examples" / "gpt.py", "gpt_shared_branches")
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**SIZE, norm_candidates=("pre", "post", "deepnorm")))
    for block in model.transformer.h[1:]:
        block.attn, block.mlp = model.transformer.h[0].attn, model.transformer.h[0].mlp
    return model


def test_nanogpt_blocks_sharing_attn_and_mlp_get_deepnorm_s_gain_once():
    fresh = _shared_gpt()
    before = {n: p.detach().clone() for n, p in fresh.named_parameters()}
    assert autoln.deepnorm_weights(fresh, "transformer.h.1.attn_site")[1] is fresh.transformer.h[0].attn.c_proj.weight
    autoln.derive(fresh, _all(fresh, "deepnorm"))
    _, b = deepnorm_constants(3)
    d = SIZE["n_embd"]
    h0 = "transformer.h.0."
    after = dict(fresh.named_parameters())
    torch.testing.assert_close(after[h0 + "attn.c_attn.weight"][2 * d:], b * before[h0 + "attn.c_attn.weight"][2 * d:], rtol=0, atol=0)
    assert torch.equal(after[h0 + "attn.c_attn.weight"][:2 * d], before[h0 + "attn.c_attn.weight"][:2 * d])
    for name in ("attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"):  # b, not b**3
        torch.testing.assert_close(after[h0 + name], b * before[h0 + name], rtol=0, atol=0)


class LlamaAttention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d, bias=False) for _ in range(4))


class Attention(nn.Module):
    """torch's attention; ``kdim`` other than ``d`` keeps separate q, k, v weights (``v_proj_weight``)."""

    def __init__(self, d: int, kdim=None) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(d, 2, kdim=kdim, vdim=kdim)


class Block(nn.Module):
    def __init__(self, attn: nn.Module, ffn: nn.Module, d: int, n_layers: int, layer: int) -> None:
        super().__init__()
        self.attn_site, self.attn = autoln.Site(["pre", "deepnorm"], d, n_layers, layer=layer), attn
        self.ffn_site, self.ffn = autoln.Site(["pre", "deepnorm"], d, n_layers, layer=layer), ffn


class Shared(nn.Module):
    def __init__(self, attn: nn.Module, d: int = 8, blocks: int = 3, depths=None) -> None:
        super().__init__()
        ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        depths = depths or [blocks] * blocks
        self.blocks = nn.ModuleList(Block(attn, ffn, d, depths[i], i + 1) for i in range(blocks))


def _scaled_once(model: nn.Module, expect: dict, b: float, **kw) -> None:
    """Derive ``model`` all-DeepNorm; each tensor of ``expect`` (name -> (rows scaled, rows kept)) is ``b`` times its start."""
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    autoln.derive(model, _all(model, "deepnorm", ("pre", "deepnorm")), **kw)
    after = dict(model.named_parameters())
    for name, (scaled, kept) in expect.items():
        torch.testing.assert_close(after[name][scaled], b * before[name][scaled], rtol=0, atol=0)
        assert torch.equal(after[name][kept], before[name][kept]), name
    untouched = [n for n in after if n not in expect and not torch.equal(after[n], before[n])]  # the derived sites keep one norm
    assert untouched == [], untouched


ALL, NONE = slice(None), slice(0, 0)
FFN = {"blocks.0.ffn.0.weight": (ALL, NONE), "blocks.0.ffn.2.weight": (ALL, NONE)}


@pytest.mark.parametrize("attn, expect", [
    (LlamaAttention(8), {"blocks.0.attn.wv.weight": (ALL, NONE), "blocks.0.attn.wo.weight": (ALL, NONE)}),
    (Attention(8), {"blocks.0.attn.mha.in_proj_weight": (slice(16, 24), slice(0, 16)),
                    "blocks.0.attn.mha.out_proj.weight": (ALL, NONE)}),
    (Attention(8, kdim=6), {"blocks.0.attn.mha.v_proj_weight": (ALL, NONE), "blocks.0.attn.mha.out_proj.weight": (ALL, NONE)}),
], ids=["llama-wv-wo", "mha-packed", "mha-separate"])
def test_every_way_of_finding_a_shared_branch_s_weights_scales_them_once(attn, expect):
    torch.manual_seed(0)
    _scaled_once(Shared(attn), expect | FFN, deepnorm_constants(3)[1])


def test_weights_the_caller_names_for_several_sites_are_scaled_once():
    torch.manual_seed(0)
    model = Shared(LlamaAttention(8))
    a = model.blocks[0].attn
    # every site names the same two weights, and the whole wv as well as a view of its rows
    _scaled_once(model, {"blocks.0.attn.wv.weight": (ALL, NONE), "blocks.0.attn.wo.weight": (ALL, NONE)}, deepnorm_constants(3)[1],
                 deepnorm_weights=lambda site: [a.wv.weight, a.wv.weight[2:5], a.wo.weight])


def test_a_weight_shared_by_sites_of_different_gains_is_refused_in_one_line_before_any_change():
    torch.manual_seed(0)
    model = Shared(LlamaAttention(8), depths=[3, 3, 6])  # the third block's sites say N=6
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"^DeepNorm's init gain: sites 'blocks.0.attn_site' and 'blocks.2.attn_site' share a "
                                         r"branch weight \(8, 8\) but not their gain \(0\.451801 against 0\.379918: different "
                                         r"n_layers\); give both sites the model's number of blocks N$"):
        autoln.derive(model, _all(model, "deepnorm", ("pre", "deepnorm")))
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
