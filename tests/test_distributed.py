"""Data-parallel training with torch.distributed (gloo, 2 CPU processes under torchrun): every
rank holds the same alphas and weights bitwise, the result equals a one-process run up to the
order of floating-point sums, and only rank 0 writes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from autoln.core import distributed
from autoln.core.errors import ConfigError

from .conftest import ROOT
from .ddp_worker import OVERRIDES

TINY = str(ROOT / "configs" / "tiny.yaml")


def torchrun(*args: str, cache: str, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "XDG_CACHE_HOME": cache, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def test_two_processes_hold_identical_alphas_and_weights_and_write_once(tmp_path, cache_dir):
    proc = torchrun(str(ROOT / "tests" / "ddp_worker.py"), str(tmp_path), TINY, cache=cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert (r0["rank"], r1["rank"], r0["world"]) == (0, 1, 2)
    for part in ("supernet", "derived"):
        assert r0[part].keys() == r1[part].keys()
        for key in r0[part]:
            assert torch.equal(r0[part][key], r1[part][key]), f"{part} {key} differs between ranks"
    assert r0["search_valid"] == r1["search_valid"] and r0["retrain_valid"] == r1["retrain_valid"]
    # only rank 0 wrote the genotype and the metrics, and there is one TensorBoard file per run
    assert r0["writes"] == {"genotype": 1, "metrics": 1} and r1["writes"] == {"genotype": 0, "metrics": 0}
    for run in ("search", "retrain"):
        assert len(list((tmp_path / run).glob("events.out.tfevents.*"))) == 1

    # the same runs in one process, dropout 0.2 included: same batches (each rank took half of
    # each) and the same dropout masks (each rank applied its half of the whole batch's), same result
    from autoln.config import load_config
    from autoln.retrain.run_retrain import run_retrain
    from autoln.oneshot.run_search import run_search

    os.environ["XDG_CACHE_HOME"] = cache_dir
    cfg = load_config(TINY, OVERRIDES)
    assert cfg.model.dropout == 0.2
    single = run_search(cfg, tmp_path / "single")
    alphas = r0["supernet"]["alphas"]
    assert not torch.allclose(alphas, torch.zeros_like(alphas), atol=1e-2)  # the alphas moved
    torch.testing.assert_close(alphas, single.model.alphas.detach(), rtol=0, atol=1e-5)
    for key, value in single.model.state_dict().items():
        torch.testing.assert_close(r0["supernet"][key], value, rtol=1e-4, atol=1e-5)
    derived = run_retrain(cfg, str(tmp_path / "search" / "genotype.json"), tmp_path / "single_retrain").model
    for key, value in derived.state_dict().items():
        torch.testing.assert_close(r0["derived"][key], value, rtol=1e-4, atol=1e-5)


def test_torchrun_search_command_prints_once(tmp_path, cache_dir):
    proc = torchrun(str(ROOT / "search.py"), "--config", TINY, "--set", "search.steps=4", "--set", "search.warmup_steps=1", "--set", "search.eval_every=4", "--set", "search.arch_warmup_steps=0",
                    "--set", "logging.progress=false", "--out", str(tmp_path / "run"), cache=cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("genotype:") == 1 and "2 processes" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "run").iterdir() if not p.name.startswith("events")) == \
        ["alphas.png", "alphas_heatmap.png", "checkpoint.pt", "config.yaml", "genotype.json"]


@pytest.mark.parametrize("script,args", [("search.py", ["--tune"]), ("retrain.py", ["--compare"])])
def test_jobs_of_several_runs_refuse_torchrun(script, args, tmp_path):
    env = {**os.environ, "WORLD_SIZE": "2", "XDG_CACHE_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(ROOT / script), *args, "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and "cannot run under torchrun" in proc.stderr and args[0] in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "x").exists()


def test_global_batch_must_split_evenly(monkeypatch):
    monkeypatch.setattr(distributed, "world_size", lambda: 3)
    with pytest.raises(ConfigError, match=r"search.batch_size=16 must be divisible by the number of processes \(3\)"):
        distributed.check_batch(16, "search.batch_size")
    assert distributed.check_batch(18, "search.batch_size") == 6


def test_one_process_helpers_are_identities():
    t = torch.arange(6.0).view(2, 3)
    distributed.average_([t])
    assert torch.equal(t, torch.arange(6.0).view(2, 3))
    assert distributed.shard(t)[0] is t and distributed.all_sum([1.5, 2.0], torch.device("cpu")) == [1.5, 2.0]
    assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (0, 1, True)
