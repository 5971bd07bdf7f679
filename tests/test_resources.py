"""Resource limits: the memory estimate before a run, and allocation failures as one line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from autoln import cli
from autoln.retrain import run_retrain as rr
from autoln.config import ModelConfig
from autoln.core.errors import ConfigError
from autoln.models.genotype import baseline
from autoln.models.model import build_derived
from autoln.space.placements import branch_calls
from autoln.models.resources import GIB, SLOW_FACTOR, check_fits, check_time, estimate, is_out_of_memory, parameter_count, step_flops
from autoln.models.supernet import Supernet

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")


@pytest.mark.parametrize("mc", [ModelConfig(), ModelConfig(n_layers=3, d_model=16, n_heads=2, d_ff=32, context=8),
                                ModelConfig(output_bias="none", candidates=["pre", "post"])])
def test_parameter_count_is_the_models(mc):
    derived = build_derived(mc, 256, [("pre", "post")] * mc.n_layers)
    assert parameter_count(mc, 256) == sum(p.numel() for p in derived.parameters()) + (256 if mc.output_bias == "none" else 0)
    supernet = Supernet(mc, 256)  # the supernet holds every candidate's norms: a few d_model more per block
    extra = sum(p.numel() for n, p in supernet.named_weight_parameters()) - parameter_count(mc, 256)
    assert 0 <= extra + (256 if mc.output_bias == "none" else 0) <= 8 * mc.d_model * mc.n_layers


def test_estimate_and_refusal_name_the_keys_and_gib():
    mc = ModelConfig(d_model=262144, n_heads=1)
    est = estimate(mc, 256, 16, supernet=False)
    p = parameter_count(mc, 256)
    assert est.state == 16 * p and est.total == est.state + est.activations
    # activations: 16 x 128 tokens x (6 blocks x (6 d + 2 d_ff) + 3 V) x 4 bytes
    assert est.activations == 4 * 16 * 128 * (6 * (6 * 262144 + 2 * 384) + 3 * 256)
    with pytest.raises(ConfigError) as err:
        check_fits(mc, 256, 16, torch.device("cpu"), False, "retrain", free=64 * GIB)
    msg = str(err.value)
    assert f"{est.total / GIB:,.1f} GiB" in msg and "64.0 GiB are free" in msg
    assert "model.d_model (262144)" in msg and "retrain.batch_size" in msg
    assert check_fits(ModelConfig(), 256, 16, torch.device("cpu"), True, "search", free=64 * GIB).total < GIB


def test_step_flops_follow_kaplan_and_a_long_context_warns_of_its_time(capsys):
    """Kaplan et al. 2020's count, by hand for 2 blocks, d 8, d_ff 16, T 4, V 10, 3 rows: per
    token 2 x 2 x (4 x 64 + 2 x 8 x 16 + 4 x 8) + 2 x 10 x 8 = 2336, a step 3 x that x 12 tokens;
    the supernet of pre/post/deepnorm runs each branch twice and takes two passes. The default
    config is the reference (ratio 1, no warning); a context of 100,000 tokens is thousands of
    times slower per step, quadratic in the context, and warns with the key to lower."""
    mc = ModelConfig(n_layers=2, d_model=8, n_heads=2, d_ff=16, context=4)
    assert step_flops(mc, 10, 3, supernet=False) == 3 * 2336 * 12
    per_token = 2 * 2 * 2 * (4 * 64 + 2 * 8 * 16 + 4 * 8) + 2 * 10 * 8
    assert step_flops(mc, 10, 3, supernet=True) == 2 * 3 * per_token * 12
    assert check_time(ModelConfig(), 256, 16, True, "search") == 1.0
    assert capsys.readouterr().err == ""
    ratio = check_time(ModelConfig(context=100_000), 256, 16, True, "search")
    assert ratio > 1000 * SLOW_FACTOR
    err = capsys.readouterr().err
    assert "warning: one step costs about" in err and "model.context squared (100000)" in err and "search.batch_size (16)" in err


def test_allocation_failures_are_recognised():
    assert is_out_of_memory(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    assert is_out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert is_out_of_memory(MemoryError())
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_a_genotype_too_large_for_the_machine_is_refused_before_building(tmp_path):
    g = baseline("all-pre", ModelConfig(n_layers=2, d_model=262144, n_heads=1, d_ff=128, context=32), 256)
    path = tmp_path / "huge.json"
    g.save(path)
    proc = subprocess.run([sys.executable, str(ROOT / "retrain.py"), "--config", TINY, "--genotype", str(path),
                           "--out", str(tmp_path / "r")], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "GiB" in proc.stderr and "model.d_model (262144)" in proc.stderr and not (tmp_path / "r").exists()
    assert f"error: {path}: " in proc.stderr and "--set model.* does not change" in proc.stderr


def test_out_of_memory_during_a_run_is_one_line_and_keeps_the_checkpoint(tmp_path, monkeypatch, capsys, cache_dir):
    monkeypatch.setenv("XDG_CACHE_HOME", cache_dir)
    step = rr.train_step
    calls = [0]

    def failing(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 6:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes. Error code 12")
        return step(*args, **kwargs)

    monkeypatch.setattr(rr, "train_step", failing)
    out = tmp_path / "r"
    code = cli.retrain_main(["--config", TINY, "--genotype", "all-pre", "--set", "retrain.steps=10", "--set", "checkpoint.every=4",
                             "--set", "retrain.eval_every=10", "--set", "logging.progress=false", "--set", "logging.tensorboard=false",
                             "--out", str(out)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_OUT_OF_MEMORY == 4
    assert "error: out of memory: DefaultCPUAllocator: can't allocate memory" in err and "Traceback" not in err
    assert torch.load(out / "checkpoint.pt", weights_only=False)["step"] == 4 and not (out / "metrics.json").exists()
    assert "The run folder keeps its last checkpoint; once memory is free, continue with: " in err


def test_out_of_memory_at_the_first_step_says_there_is_no_checkpoint(tmp_path, monkeypatch, capsys, cache_dir):
    monkeypatch.setenv("XDG_CACHE_HOME", cache_dir)

    def failing(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 4294967296 bytes. Error code 12")

    monkeypatch.setattr(rr, "train_step", failing)
    out = tmp_path / "r"
    code = cli.retrain_main(["--config", TINY, "--genotype", "all-pre", "--set", "logging.progress=false",
                             "--set", "logging.tensorboard=false", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_OUT_OF_MEMORY and not (out / "checkpoint.pt").exists()
    assert "No checkpoint was written before it (it starts again from step 0); once memory is free, continue with: " in err
    assert "keeps its last checkpoint" not in err


def test_a_search_too_large_for_the_machine_is_refused(tmp_path, capsys, cache_dir, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", cache_dir)
    code = cli.search_main(["--config", TINY, "--set", "model.d_model=262144", "--set", "model.n_heads=1", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2 and "the supernet needs at least" in err and "search.batch_size" in err and not (tmp_path / "s").exists()


@pytest.mark.parametrize("candidates,calls", [(["pre", "post", "deepnorm"], 2), (["pre", "post", "deepnorm", "peri", "outnorm", "lns", "none"], 3),
                                              (["post", "none"], 1), (["pre", "pre:fixed", "peri"], 2)])
def test_supernet_estimate_counts_one_branch_call_per_distinct_input(candidates, calls):
    mc = ModelConfig(candidates=candidates)
    site = Supernet(mc, 256).blocks[0].attn_site
    assert branch_calls(mc.searched_candidates()) == len(site.input_groups()) == calls
    per_call = 6 * mc.d_model + 2 * mc.d_ff
    assert estimate(mc, 256, 16, supernet=True).activations == 4 * 16 * 128 * (6 * calls * per_call + 3 * 256)


def test_a_run_near_the_free_memory_gets_a_warning(capsys):
    est = estimate(ModelConfig(), 256, 16, supernet=True)
    check_fits(ModelConfig(), 256, 16, torch.device("cpu"), True, "search", free=int(est.total / 0.6))
    err = capsys.readouterr().err
    assert err.startswith("warning: the supernet needs at least") and "search.batch_size" in err and "model.context (128)" in err
    check_fits(ModelConfig(), 256, 16, torch.device("cpu"), True, "search", free=int(est.total / 0.4))
    assert capsys.readouterr().err == ""


def test_the_retrain_time_estimate_follows_the_config_s_size():
    """retrain_seconds against the README's measured times: the default retrain 114 s on 2 idle
    cores (within 10 %), and the tiny --compare of 10 genotypes x 3 seeds, measured at 62 s,
    within 3x (the estimate the next: line prints after a tiny retrain)."""
    from autoln.config import load_config
    from autoln.models.resources import retrain_seconds

    default = load_config(None)
    assert retrain_seconds(default.model, 256, default.retrain) == pytest.approx(114, rel=0.1)
    tiny = load_config(ROOT / "configs" / "tiny.yaml")
    assert 62 / 3 <= 30 * retrain_seconds(tiny.model, 256, tiny.retrain) <= 62 * 3
