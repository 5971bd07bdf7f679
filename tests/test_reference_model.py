"""experiments/reference_model.py, the independent minimal model that checks a badly losing
baseline: with autoln's weights copied in it computes the same function as autoln's derived model
for each of its placements, and its own start matches autoln's documented one."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from autoln.config import ModelConfig
from autoln.model import build_derived

from .conftest import ROOT

sys.path.insert(0, str(ROOT / "experiments"))
import reference_model as ref  # noqa: E402

L, D, H, FF, T, V = 3, 16, 2, 40, 8, 11


def _copy_autoln_weights(model, theirs, placement: str) -> None:
    """Load autoln's derived model's weights into the reference model (q, k, v stacked)."""
    with torch.no_grad():
        model.wte.weight.copy_(theirs.tok_emb.weight)
        model.wpe.weight.copy_(theirs.pos_emb.weight)
        model.bias.copy_(theirs.lm_head.bias)
        model.ln_f.load_state_dict(theirs.norm_f.state_dict())
        for mine, block in zip(model.blocks, theirs.blocks):
            attn, mlp = mine
            attn.branch.qkv.weight.copy_(torch.cat([block.attn.q_proj.weight, block.attn.k_proj.weight, block.attn.v_proj.weight]))
            attn.branch.proj.weight.copy_(block.attn.o_proj.weight)
            mlp.branch.fc.weight.copy_(block.ffn.fc1.weight)
            mlp.branch.proj.weight.copy_(block.ffn.fc2.weight)
            if placement != "none":
                attn.ln.load_state_dict(block.attn_site.placements[placement].norm.state_dict())
                mlp.ln.load_state_dict(block.ffn_site.placements[placement].norm.state_dict())


@pytest.mark.parametrize("placement", ref.PLACEMENTS)
def test_the_reference_model_computes_autoln_s_derived_model_with_its_weights(placement):
    cfg = ModelConfig(n_layers=L, d_model=D, n_heads=H, d_ff=FF, context=T)
    torch.manual_seed(0)
    theirs = build_derived(cfg, V, [(placement, placement)] * L).init_output_bias(torch.log_softmax(torch.randn(V), 0))
    with torch.no_grad():  # norms away from their start, so a misplaced norm shows
        for name, p in theirs.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    model = ref.GPT(V, T, L, D, H, FF, placement, "scaled", np.zeros(V))
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in theirs.parameters())
    _copy_autoln_weights(model, theirs, placement)
    idx = torch.randint(0, V, (4, T))
    torch.testing.assert_close(model(idx), theirs(idx)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("start", ref.STARTS)
def test_the_reference_start_is_autoln_s_documented_one(start):
    torch.manual_seed(0)
    layers, d, d_ff = 24, 64, 256
    unigram = np.log(np.full(V, 1.0 / V))
    model = ref.GPT(V, 128, layers, d, 4, d_ff, "pre", start, unigram)
    gain = (2 * layers) ** -0.5 if start == "scaled" else 1.0
    projections = torch.cat([b[0].branch.proj.weight.flatten() for b in model.blocks])
    fc2 = torch.cat([b[1].branch.proj.weight.flatten() for b in model.blocks])
    # xavier_normal_: std sqrt(2 / (fan_in + fan_out)), times GPT-2's 1/sqrt(2N) when scaled
    assert projections.std().item() == pytest.approx(gain * (2 / (2 * d)) ** 0.5, rel=0.02)
    assert fc2.std().item() == pytest.approx(gain * (2 / (d + d_ff)) ** 0.5, rel=0.02)
    q = torch.cat([b[0].branch.qkv.weight[:d].flatten() for b in model.blocks])
    assert q.std().item() == pytest.approx((2 / (2 * d)) ** 0.5, rel=0.02)
    assert model.wte.weight.std().item() == pytest.approx(0.02, rel=0.05)
    np.testing.assert_array_equal(model.bias.detach().numpy(), unigram.astype(np.float32))


def test_a_finished_record_is_reused_only_for_its_own_settings(tmp_path, capsys):
    record = {"placement": "pre", "start": "scaled", "layers": 6, "d_model": 64, "heads": 4, "d_ff": 384, "seed": 0,
              "valid_bits_per_byte": 2.5}
    (tmp_path / "pre-scaled-L6-s0.json").write_text(json.dumps(record))
    common = ["--data", "stdlib", "--placement", "pre", "--out", str(tmp_path)]
    assert ref.main(common + ["--d-model", "64"]) == 0
    assert "reused, valid 2.500" in capsys.readouterr().out
    assert ref.main(common) == 2
    assert "holds a run of other settings (d_model 64, not 96): choose another --out" in capsys.readouterr().err
