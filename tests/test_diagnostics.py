"""Diagnostics on tiny hand-checkable cases (docs/design.md §7)."""

import math

import pytest
import torch

from autoln.config import ModelConfig
from autoln.models.diagnostics import (SpikeCounter, angular_distance, angular_distances, grad_norms, logits,
                                residual_norms, update_size)
from autoln.models.model import build_derived


def model_of(placement: str, n_layers: int = 8, d: int = 32):
    cfg = ModelConfig(n_layers=n_layers, d_model=d, n_heads=2, d_ff=4 * d, context=16)
    torch.manual_seed(0)
    return build_derived(cfg, 64, [(placement, placement)] * n_layers)


def batch(b: int = 4, t: int = 16):
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (b, t), generator=g), torch.randint(0, 64, (b, t), generator=g)


def test_angular_distance_identity_orthogonal_opposite():
    x = torch.randn(3, 5, 8)
    assert angular_distance(x, x) == pytest.approx(0.0, abs=1e-6)
    assert angular_distance(x, -x) == pytest.approx(1.0, abs=1e-6)
    e1, e2 = torch.eye(8)[0].expand(3, 5, 8), torch.eye(8)[1].expand(3, 5, 8)
    assert angular_distance(e1, e2) == pytest.approx(0.5, abs=1e-12)
    assert angular_distance(e1, e1 + e2) == pytest.approx(0.25, abs=1e-12)  # 45 degrees
    with pytest.raises(ValueError, match="shapes differ"):
        angular_distance(x, x[:, :4])


def test_a_pre_ln_block_with_zero_branches_is_the_identity():
    model = model_of("pre", n_layers=3)
    with torch.no_grad():
        model.blocks[1].attn.o_proj.weight.zero_()
        model.blocks[1].ffn.fc2.weight.zero_()
    d = angular_distances(model, batch()[0])
    assert d[1] == pytest.approx(0.0, abs=1e-6) and d[0] > 0.05 and d[2] > 0.05


def test_residual_norm_grows_with_depth_for_pre_ln_and_stays_sqrt_d_for_post_ln():
    x = batch()[0]
    pre = residual_norms(model_of("pre"), x)
    assert len(pre) == 9 and all(b > a for a, b in zip(pre, pre[1:]))
    post = residual_norms(model_of("post"), x)
    assert post[1:] == pytest.approx([math.sqrt(32)] * 8, rel=1e-3)  # each block ends in LayerNorm (gain 1, bias 0)


def test_grad_norms_shapes_and_untouched_grads():
    model = model_of("post", n_layers=4)
    x, y = batch()
    g = grad_norms(model, x, y)
    assert len(g["attn_out"]) == len(g["ffn_out"]) == 4 and all(v > 0 for v in g["attn_out"] + g["ffn_out"])
    assert all(p.grad is None for p in model.parameters())


def test_update_size_is_zero_at_init_and_positive_after_a_step():
    model = model_of("deepnorm", n_layers=2)
    x, y = batch()
    ref = logits(model, x)
    assert update_size(model, x, ref) == 0.0
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(x, y)[1].backward()
    opt.step()
    assert update_size(model, x, ref) > 0


def test_spike_counter():
    c = SpikeCounter(factor=1.5, decay=0.5, warmup=2)
    flags = [c.update(v) for v in [4.0, 4.0, 4.0, 7.0, 4.0, float("nan")]]
    assert flags == [False, False, False, True, False, True] and c.spikes == 2
    assert SpikeCounter(warmup=0).update(1.0) is False
    with pytest.raises(ValueError, match="factor > 1"):
        SpikeCounter(factor=1.0)


def test_output_change_is_one_sign_step_of_the_final_state(tiny_model_cfg):
    """Admin's output change against a hand-made copy stepped by ``lr * sign(grad)``; the
    model's weights are untouched, and a supernet's alphas take no step."""
    import copy

    from autoln.models.diagnostics import output_change
    from autoln.models.supernet import Supernet

    x = torch.randint(0, 23, (2, tiny_model_cfg.context))
    y = torch.randint(0, 23, (2, tiny_model_cfg.context))
    for model in (build_derived(tiny_model_cfg, 23, [("post", "pre")] * tiny_model_cfg.n_layers), Supernet(tiny_model_cfg, 23)):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        moved = copy.deepcopy(model)
        params = [p for n, p in moved.named_parameters() if n != "alphas"]
        _, loss = moved(x, y)
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            h0 = moved.norm_f(moved.hidden_states(x)[-1]).double()
            for p, g in zip(params, grads):
                p.sub_(1e-3 * g.sign())
            h1 = moved.norm_f(moved.hidden_states(x)[-1]).double()
        want = float((h1 - h0).norm(dim=-1).mean() / h0.norm(dim=-1).mean())
        assert output_change(model, x, y, 1e-3) == pytest.approx(want, rel=1e-9)
        assert want > 0 and output_change(model, x, y, 0.0) == 0.0
        assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    with pytest.raises(ValueError, match="non-negative"):
        output_change(model, x, y, -1.0)
