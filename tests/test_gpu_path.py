"""The GPU path, checked on CPU: autocast rules and bf16 forward passes, compiled blocks equal to
eager ones through every kind of pass the search makes, and gpu_check.sh's dry mode."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from autoln.oneshot.architect import Architect, weight_step
from autoln.config import ModelConfig, SearchConfig, load_config
from autoln.models.model import build_derived, full_precision
from autoln.oneshot.monitor import alpha_hessian
from autoln.models.supernet import Supernet
from autoln.engine.training import autocast_dtype, evaluate, prepare_model, weight_optimizer

from .conftest import ROOT

VOCAB = 64
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_autocast_dtype_rules():
    assert autocast_dtype("auto", CPU) is None and autocast_dtype("auto", CUDA) is torch.bfloat16
    assert autocast_dtype("bf16", CPU) is torch.bfloat16 and autocast_dtype("fp32", CUDA) is None


def test_bf16_autocast_forward_and_full_precision(tiny_model_cfg):
    model = build_derived(tiny_model_cfg, VOCAB, [("pre", "post")] * tiny_model_cfg.n_layers)
    x = torch.randint(0, VOCAB, (4, tiny_model_cfg.context))
    logits32, loss32 = model(x, x)
    prepare_model(model, CPU, SearchConfig(precision="bf16"))
    logits16, loss16 = model(x, x)
    assert logits32.dtype == torch.float32 and logits16.dtype == torch.bfloat16 and loss16.dtype == torch.float32
    assert abs(loss16.item() - loss32.item()) < 0.05
    assert model.tok_emb.weight.dtype == torch.float32  # weights stay fp32
    with full_precision(model):
        logits, loss = model(x, x)
        assert logits.dtype == torch.float32 and torch.equal(loss, loss32)
    assert model.autocast_dtype is torch.bfloat16


def test_compiled_blocks_match_eager_in_every_pass():
    """Weight step, first-order alpha step, evaluation and the alpha Hessian (double backward,
    run eagerly under the compiled blocks) agree with the eager supernet."""
    cfg = load_config(ROOT / "configs" / "tiny.yaml")  # gpu_check.sh --dry compiles the same shapes: the
    mc, sc = cfg.model, replace(cfg.search, warmup_steps=0, arch_lr=0.05)  # inductor's disk cache serves both
    torch.manual_seed(0)
    eager = Supernet(mc, 256)
    compiled = prepare_model(copy.deepcopy(eager), CPU, replace(sc, compile=True))
    data = [torch.randint(0, 256, (sc.batch_size, mc.context)) for _ in range(4)]
    results = []
    for model in (eager, compiled):
        opt, sched = weight_optimizer(model.named_weight_parameters(), sc)
        arch = Architect(model, sc)
        losses = []
        for i in range(2):
            losses.append(arch.step((data[0], data[1]), (data[2], data[3]), xi=0.01, step=i + 1))
            losses.append(weight_step(model, opt, sched, data[0], data[1], sc.grad_clip)[0])
        tokens = np.random.default_rng(0).integers(0, 256, 400)
        losses.append(evaluate(model, tokens, np.arange(0, 320, 20), mc.context, sc.batch_size, CPU))
        results.append((losses, model.alphas.detach().clone(), alpha_hessian(model, data[0], data[1])))
    (l_e, a_e, h_e), (l_c, a_c, h_c) = results
    np.testing.assert_allclose(l_c, l_e, rtol=1e-4)
    torch.testing.assert_close(a_c, a_e, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(h_c, h_e, rtol=1e-3, atol=1e-5)
    assert not torch.equal(a_e, torch.zeros_like(a_e))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fused AdamW needs a CUDA device")
def test_fused_adamw_on_cuda():
    model = prepare_model(build_derived(ModelConfig(n_layers=1), VOCAB, [("pre", "pre")]), torch.device("cuda"), SearchConfig())
    opt, _ = weight_optimizer(list(model.named_parameters()), SearchConfig())
    assert opt.defaults["fused"] is True and model.autocast_dtype is torch.bfloat16


def test_gpu_check_dry_mode_runs(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "check"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("tokens/s") == 1 and proc.stdout.count("MFU") == 1 and "== 3. end-to-end search" in proc.stdout
    assert "genotype:" in proc.stdout and (tmp_path / "check" / "search" / "genotype.json").exists()
    res = json.loads((tmp_path / "check" / "eager.json").read_text())["default"]["variants"]
    assert set(res) == {"derived", "supernet_weight", "search_order1"} and all(0 < v["mfu"] < 1 for v in res.values())
