"""experiments/truth/reference_model.py, the independent minimal model that checks a badly losing
baseline: with autoln's weights copied in it computes the same function as autoln's derived model
for each of its placements, and its own start matches autoln's documented one."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
import torch

from autoln.config import ModelConfig
from autoln.models.model import build_derived
from experiments.truth import reference_model as ref

L, D, H, FF, T, V = 3, 16, 2, 40, 8, 11


def _copy_autoln_weights(model, theirs, placements: list[str]) -> None:
    """Load autoln's derived model's weights into the reference model (q, k, v stacked); one
    placement per block."""
    with torch.no_grad():
        model.wte.weight.copy_(theirs.tok_emb.weight)
        model.wpe.weight.copy_(theirs.pos_emb.weight)
        model.bias.copy_(theirs.lm_head.bias)
        model.ln_f.load_state_dict(theirs.norm_f.state_dict())
        for mine, block, placement in zip(model.blocks, theirs.blocks, placements):
            attn, mlp = mine
            attn.branch.qkv.weight.copy_(torch.cat([block.attn.q_proj.weight, block.attn.k_proj.weight, block.attn.v_proj.weight]))
            attn.branch.proj.weight.copy_(block.attn.o_proj.weight)
            mlp.branch.fc.weight.copy_(block.ffn.fc1.weight)
            mlp.branch.proj.weight.copy_(block.ffn.fc2.weight)
            if placement != "none":
                attn.ln.load_state_dict(block.attn_site.placements[placement].norm.state_dict())
                mlp.ln.load_state_dict(block.ffn_site.placements[placement].norm.state_dict())


@pytest.mark.parametrize("placement", [*ref.PLACEMENTS, "pre,post,post", "post,pre,none"])
def test_the_reference_model_computes_autoln_s_derived_model_with_its_weights(placement):
    placements = placement.split(",") * (L if "," not in placement else 1)
    cfg = ModelConfig(n_layers=L, d_model=D, n_heads=H, d_ff=FF, context=T)
    torch.manual_seed(0)
    theirs = build_derived(cfg, V, [(p, p) for p in placements]).init_output_bias(torch.log_softmax(torch.randn(V), 0))
    with torch.no_grad():  # norms away from their start, so a misplaced norm shows
        for name, p in theirs.named_parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn_like(p))
    model = ref.GPT(V, T, L, D, H, FF, placements, "scaled", np.zeros(V))
    assert [sub.placement for block in model.blocks for sub in block] == [p for p in placements for _ in (0, 1)]
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in theirs.parameters())
    _copy_autoln_weights(model, theirs, placements)
    idx = torch.randint(0, V, (4, T))
    torch.testing.assert_close(model(idx), theirs(idx)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("start", ref.STARTS)
def test_the_reference_start_has_autoln_s_statistics_matrix_by_matrix(start):
    cfg = ModelConfig(n_layers=24, d_model=64, n_heads=4, d_ff=256, context=128,
                      residual_init="scaled" if start == "scaled" else "unscaled")
    torch.manual_seed(0)
    theirs = build_derived(cfg, V, [("pre", "pre")] * cfg.n_layers)
    torch.manual_seed(1)
    unigram = np.log(np.full(V, 1.0 / V))
    model = ref.GPT(V, 128, cfg.n_layers, cfg.d_model, 4, cfg.d_ff, "pre", start, unigram)
    d = cfg.d_model

    def std(tensors) -> float:
        return torch.cat([w.detach().flatten() for w in tensors]).std().item()

    pairs = {  # reference matrices, autoln's, pooled over the 24 blocks
        "q": ([b[0].branch.qkv.weight[:d] for b in model.blocks], [b.attn.q_proj.weight for b in theirs.blocks]),
        "k": ([b[0].branch.qkv.weight[d:2 * d] for b in model.blocks], [b.attn.k_proj.weight for b in theirs.blocks]),
        "v": ([b[0].branch.qkv.weight[2 * d:] for b in model.blocks], [b.attn.v_proj.weight for b in theirs.blocks]),
        "o": ([b[0].branch.proj.weight for b in model.blocks], [b.attn.o_proj.weight for b in theirs.blocks]),
        "fc1": ([b[1].branch.fc.weight for b in model.blocks], [b.ffn.fc1.weight for b in theirs.blocks]),
        "fc2": ([b[1].branch.proj.weight for b in model.blocks], [b.ffn.fc2.weight for b in theirs.blocks]),
        "wte": ([model.wte.weight], [theirs.tok_emb.weight]),
        "wpe": ([model.wpe.weight], [theirs.pos_emb.weight]),
    }
    for name, (mine, autoln_s) in pairs.items():
        assert std(mine) == pytest.approx(std(autoln_s), rel=0.03), name
    # and the formula: xavier_normal_ std sqrt(2 / (fan_in + fan_out)), times 1/sqrt(2N) when scaled
    gain = (2 * cfg.n_layers) ** -0.5 if start == "scaled" else 1.0
    assert std(pairs["fc2"][0]) == pytest.approx(gain * (2 / (d + cfg.d_ff)) ** 0.5, rel=0.02)
    np.testing.assert_array_equal(model.bias.detach().numpy(), unigram.astype(np.float32))


def test_the_reference_recipe_is_retrain_s_defaults():
    from autoln.config import RetrainConfig
    from autoln.engine.training import lr_factor

    r, cfg = ref.RECIPE, RetrainConfig()
    for key in ("steps", "batch_size", "lr", "weight_decay", "warmup_steps", "min_lr_ratio", "grad_clip", "final_eval_windows"):
        assert r[key] == getattr(cfg, key), key
    assert r["betas"] == tuple(cfg.betas) and r["eval_windows"] == cfg.eval_windows and cfg.schedule == "cosine"
    assert r["context"] == ModelConfig().context
    for step in (0, 10, 49, 50, 51, 500, 998, 999):
        assert ref.lr_factor(step) == pytest.approx(lr_factor(step, cfg), abs=1e-12), step
    no_warmup = RetrainConfig(warmup_steps=0)  # experiments/common/validate.py's highlr
    for step in (0, 1, 50, 500, 999):
        assert ref.lr_factor(step, 0) == pytest.approx(lr_factor(step, no_warmup), abs=1e-12), step
    assert ref.lr_factor(0, 0) == 1.0


def test_run_names_and_bad_arguments(capsys):
    def name(*argv):
        return ref.run_name(types.SimpleNamespace(**{"start": "scaled", "layers": 6, "seed": 0, "lr": 2e-3, "warmup_steps": 50,
                                                     **dict(zip(argv[::2], argv[1::2]))}))

    assert ref.placements_arg("pre") == ["pre"] and ref.placements_arg("pre,post") == ["pre", "post"]
    assert name("placement", ["pre"]) == "pre-scaled-L6-s0.json"  # the records made before per-block placements
    assert name("placement", ["pre"] * 3 + ["post"] * 3) == "pre3.post3-scaled-L6-s0.json"
    assert name("placement", ["post"], "lr", 3e-3, "warmup_steps", 0) == "post-scaled-L6-lr0.003-w0-s0.json"
    for argv, message in ((["--placement", "pre,lns"], "unknown placement 'lns'"),
                          (["--placement", "pre,post"], "--placement: expected one placement or 6 (one per block), got 2"),
                          (["--placement", "pre", "--lr", "0"], "--lr: expected a positive number, got 0.0"),
                          (["--placement", "pre", "--warmup-steps", "-1"], "--warmup-steps: expected 0 to 999, got -1")):
        with pytest.raises(SystemExit) as e:
            ref.main(["--data", "stdlib", *argv])
        assert e.value.code == 2 and message in capsys.readouterr().err, argv
    # what main() passes: --placement parsed to a list, so a uniform placement is a list of one
    assert [s.placement for b in ref.GPT(V, T, 3, D, H, FF, ["pre"], "scaled", np.zeros(V)).blocks for s in b] == ["pre"] * 6
    with pytest.raises(ValueError, match="expected 1 or 3 placements, got 2"):
        ref.GPT(V, T, 3, D, H, FF, ["pre", "post"], "scaled", np.zeros(V))


def test_a_finished_record_is_reused_only_for_its_own_settings(tmp_path, capsys):
    from autoln.config import load_config
    from autoln.data import load_corpus

    fingerprint = load_corpus(load_config(None, ["data.corpus=stdlib"]).data).fingerprint
    record = {"placement": "pre", "start": "scaled", "layers": 6, "d_model": 64, "heads": 4, "d_ff": 384, "seed": 0,
              "data_fingerprint": fingerprint, "valid_bits_per_byte": 2.5}
    path = tmp_path / "pre-scaled-L6-s0.json"
    path.write_text(json.dumps(record))
    common = ["--data", "stdlib", "--placement", "pre", "--out", str(tmp_path)]
    assert ref.main(common + ["--d-model", "64"]) == 0
    assert "reused, valid 2.500" in capsys.readouterr().out
    assert ref.main(common) == 2
    assert "holds a run of other settings (d_model 64, not 96): choose another --out" in capsys.readouterr().err
    path.write_text(json.dumps({**record, "data_fingerprint": "0" * 64}))  # another corpus
    assert ref.main(common + ["--d-model", "64"]) == 2
    assert f"data_fingerprint '{'0' * 64}', not '{fingerprint}'" in capsys.readouterr().err
    path.write_text(json.dumps({k: v for k, v in record.items() if k != "data_fingerprint"}))  # corpus unknown
    assert ref.main(common + ["--d-model", "64"]) == 2
    assert "data_fingerprint None" in capsys.readouterr().err


@pytest.mark.parametrize("placement", ["post", "pre,post"])
def test_a_short_run_through_main_writes_its_record(tmp_path, monkeypatch, placement):
    # the whole command on a 2-block model for 3 steps: uniform and per-block placements reach the model
    monkeypatch.setitem(ref.RECIPE, "steps", 3)
    monkeypatch.setitem(ref.RECIPE, "final_eval_windows", 8)
    argv = ["--data", "stdlib", "--placement", placement, "--layers", "2", "--d-model", "16", "--heads", "2", "--d-ff", "32",
            "--lr", "3e-3", "--warmup-steps", "0", "--out", str(tmp_path)]
    assert ref.main(argv) == 0
    name = {"post": "post", "pre,post": "pre1.post1"}[placement]
    record = json.loads((tmp_path / f"{name}-scaled-L2-lr0.003-w0-s0.json").read_text())
    assert record["placement"] == placement and record["lr"] == 3e-3 and record["warmup_steps"] == 0 and record["steps"] == 3
    assert 0 < record["valid_bits_per_byte"] < 10
