"""The benchmark's own pieces: the naive reference supernet computes the same function, and the
CPU memory tracker counts allocations and frees exactly."""

from __future__ import annotations

import copy
import importlib.util
import sys

import torch

from autoln.models.supernet import Supernet

from .conftest import ROOT

spec = importlib.util.spec_from_file_location("bench_step", ROOT / "benchmarks" / "bench_step.py")
bench = importlib.util.module_from_spec(spec)
sys.modules["bench_step"] = bench  # dataclasses look their module up
spec.loader.exec_module(bench)


def test_naive_supernet_is_the_same_function(tiny_model_cfg):
    net = Supernet(tiny_model_cfg, 32)
    with torch.no_grad():
        net.alphas.normal_()
    naive = bench.make_naive(copy.deepcopy(net))
    x = torch.randint(0, 32, (3, tiny_model_cfg.context))
    torch.testing.assert_close(naive(x, x)[0], net(x, x)[0], rtol=1e-5, atol=1e-6)


def test_naive_supernet_is_the_same_function_for_the_wide_list(tiny_model_cfg):
    # shared branch calls and folded mixing weights (peri, outnorm) against sum_k w_k p_k(x, F)
    from dataclasses import replace

    for norm, affine in (("layernorm", "search"), ("dyt", "learnable"), ("rmsnorm", "fixed")):
        net = Supernet(replace(tiny_model_cfg, candidates=bench.WIDE, norm=norm, affine=affine), 32)
        with torch.no_grad():
            net.alphas.normal_()
            for name, p in net.named_parameters():
                if "norm" in name:
                    p.add_(0.1 * torch.randn_like(p))
        naive = bench.make_naive(copy.deepcopy(net))
        x = torch.randint(0, 32, (3, tiny_model_cfg.context))
        torch.testing.assert_close(naive(x, x)[0], net(x, x)[0], rtol=1e-5, atol=1e-5)


def test_live_bytes_counts_allocations_and_frees():
    state = [torch.zeros(250)]  # 1000 bytes of tracked state
    tracker = bench.LiveBytes(state)
    with tracker:
        a = torch.ones(1000)  # 4000 bytes
        b = a * 2  # 4000 more, peak 9000
        view = b[10:]  # a view: no new storage
        del a, b
        c = view + 1  # 3960 bytes; a is freed (4000), b lives through the view
    assert tracker.peak == 1000 + 4000 + 4000 + 0
    assert tracker.live == 1000 + 4000 + 3960
    del c, view


def test_cpu_allocator_keeps_freed_memory_on_glibc():
    import platform

    import pytest

    from autoln.engine.training import keep_cpu_memory

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert keep_cpu_memory() is True


def test_the_example_variants_train_the_example_model_through_the_public_api(tmp_path):
    """``example_weight`` is the weight step of examples/gpt.py searched through
    autoln.SearchModel (its alphas untouched, its weights moved); ``example_derived`` its Pre-LN."""
    from autoln.config import load_config

    cfg = load_config(ROOT / "configs" / "tiny.yaml", [f"data.cache_dir={tmp_path}"])
    x = torch.randint(0, 256, (2, cfg.model.context))
    batches = [((x, x), (x, x))] * bench.POOL
    for searched in (False, True):
        runner = bench.example_runner(cfg, 256, batches, torch.device("cpu"), searched)
        model = runner.tracked[0]
        before = {k: v.clone() for k, v in model.state_dict().items()}
        runner.step(0)
        moved = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
        assert moved and ("alphas" in model.state_dict()) == searched and "alphas" not in moved
