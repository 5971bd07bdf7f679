"""Blocks under activation checkpointing (pytorch/pytorch#141896): with
``torch.utils.checkpoint(..., use_reentrant=False)`` backward reruns a block after
``SearchModel.forward`` has returned, and its sites mix as the forward pass did, so the weights'
and the alphas' gradients and a whole search are those without checkpointing; with
``use_reentrant=True`` the block runs without gradients, and the site says so in one line."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import autoln

from .conftest import ROOT
from .test_nanogpt_diff import load

SIZE = dict(block_size=16, vocab_size=48, n_layer=3, n_head=2, n_embd=32, bias=False)


def _gpt(reentrant=None):
    """nanoGPT changed as the README shows; with ``reentrant`` a bool, every block runs under
    ``torch.utils.checkpoint(block, x, use_reentrant=reentrant)``."""
    gpt = load(ROOT / "examples" / "gpt.py", "gpt_checkpointed")
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(**SIZE, norm_candidates=("pre", "post", "deepnorm")))
    if reentrant is not None:
        for block in model.transformer.h:
            block.forward = lambda x, block=block, f=type(block).forward: checkpoint(f, block, x, use_reentrant=reentrant)
    return model


def _batches(n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(x[:, :-1].contiguous(), x[:, 1:].contiguous()) for x in (torch.randint(0, SIZE["vocab_size"], (4, 17), generator=g) for _ in range(n))]


def _grads(reentrant):
    torch.manual_seed(1)
    net = autoln.SearchModel(_gpt(reentrant))
    x, y = _batches(1, 0)[0]
    _, loss = net(x, y)
    loss.backward()
    return {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}


def test_checkpointed_blocks_give_the_gradients_of_plain_blocks():
    plain, checkpointed = _grads(None), _grads(False)
    assert "alphas" in plain and set(plain) == set(checkpointed) and len(plain) > 20
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)
    assert float(plain["alphas"].abs().sum()) > 0


@pytest.mark.parametrize("order", [1, 2])
def test_a_search_of_checkpointed_blocks_is_the_search_of_plain_blocks(order):
    cfg = autoln.SearchConfig(steps=4, arch_warmup_steps=1, warmup_steps=0, eval_every=2, selection="argmax", order=order,
                              monitor_windows=2)
    runs = [autoln.search(_gpt(r), _batches(8, 0), cfg=cfg, arch_batches=_batches(8, 1), progress=False, shortlist=0)
            for r in (None, False)]
    assert runs[0].genotype.sites == runs[1].genotype.sites
    torch.testing.assert_close(runs[1].model.alphas, runs[0].model.alphas, rtol=1e-5, atol=1e-7)
    assert runs[1].losses == pytest.approx(runs[0].losses, rel=1e-5)


def test_reentrant_checkpointing_is_refused_in_one_line_naming_the_site():
    net = autoln.SearchModel(_gpt(True))
    x, y = _batches(1, 0)[0]
    with pytest.raises(ValueError, match=r"^autoln.Site 'transformer.h.0.attn_site' runs with gradients off inside a search's "
                                         r"forward pass \(torch.utils.checkpoint with use_reentrant=True, or torch.no_grad in the "
                                         r"model\), so the alphas would get no gradient: use torch.utils.checkpoint\(\.\.\., "
                                         r"use_reentrant=False\), which the search supports$"):
        net(x, y)
    with torch.no_grad():  # an evaluation without gradients is no misuse
        assert torch.isfinite(net(x, y)[1])


def test_a_searched_site_outside_the_search_model_is_still_refused_after_a_forward_pass():
    net = autoln.SearchModel(_gpt(False))
    x, y = _batches(1, 0)[0]
    net(x, y)[1].backward()
    with pytest.raises(ValueError, match="needs mixing weights"):
        net.model(x, y)
    copy.deepcopy(net)  # the held mixing weights are no part of the model
