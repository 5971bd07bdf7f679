"""``search.py --seeds N``: majority vote, agreement, and the command on a tiny config."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from autoln.config import ModelConfig
from autoln.oneshot.consensus import vote, votes_markdown
from autoln.core.errors import ConfigError
from autoln.models.genotype import Genotype, from_probabilities

from .conftest import experiment_script
from .test_cli import TINY, event_tags, run

CFG = ModelConfig(n_layers=3)


def _genotype(rows: list[list[float]]) -> Genotype:
    return from_probabilities(np.array(rows), CFG, 256)


def test_vote_majority_agreement_and_tie_break():
    a = _genotype([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.4, 0.35, 0.25]])  # pre post pre
    b = _genotype([[0.5, 0.4, 0.1], [0.1, 0.2, 0.7], [0.3, 0.6, 0.1]])    # pre deepnorm post
    c = _genotype([[0.7, 0.2, 0.1], [0.3, 0.6, 0.1], [0.2, 0.2, 0.6]])    # pre post deepnorm
    v = vote([a, b, c])
    assert v.votes.tolist() == [[3, 0, 0], [0, 2, 1], [1, 1, 1]]
    assert v.agreement == pytest.approx(1 / 3)  # only block0 is unanimous
    # block2 is a three-way tie: the largest mean probability (pre 0.30, post 0.383, deepnorm 0.317) wins
    assert [v.candidates[k] for k in v.choices] == ["pre", "post", "post"]
    np.testing.assert_allclose(v.probabilities[1], [0.2, 0.5, 0.3])
    assert vote([a, a]).agreement == 1.0
    # the table says when a tie was broken, and by what; a majority is just the majority
    rows = votes_markdown(v, [0, 1, 2]).splitlines()[-3:]
    assert rows[0].endswith("| yes | **pre** |") and rows[1].endswith("| no | **post** |")
    assert rows[2].endswith("| no | **post** (a 1-1-1 tie, broken by the larger mean probability: pre 0.300, post 0.383, deepnorm 0.317) |")
    two = vote([a, b])  # block1: post vs deepnorm, one vote each
    assert "**post** (a 1-1 tie, broken by the larger mean probability: post 0.450, deepnorm 0.400)" in votes_markdown(two, [0, 1])


def test_vote_refuses_mixed_search_spaces():
    other = from_probabilities(np.full((4, 3), 1 / 3), ModelConfig(n_layers=4), 256)
    with pytest.raises(ConfigError, match="differ"):
        vote([_genotype([[1, 0, 0]] * 3), other])


def test_seeds_command_writes_consensus_votes_and_tensorboard(tmp_path, cache_dir):
    out = tmp_path / "seeds"
    short = ["--set", "search.eval_every=6", "--set", "search.selection_tune_steps=2", "--set", "search.arch_warmup_steps=2"]
    proc = run("search.py", "--config", TINY, "--seeds", "3", "--workers", "2", "--set", "search.steps=12", *short,
               "--out", str(out), cache=cache_dir)
    seeds = [Genotype.load(out / f"seed{s}" / "genotype.json") for s in range(3)]
    assert [g.provenance["seed"] for g in seeds] == [0, 1, 2]
    consensus = Genotype.load(out / "genotype.json")
    expected = vote(seeds)
    assert consensus.describe() == " ".join(expected.candidates[k] for k in expected.choices)
    info = consensus.provenance["consensus"]
    assert info["seeds"] == [0, 1, 2] and info["agreement"] == expected.agreement
    assert [g["placements"] for g in info["genotypes"]] == [g.describe() for g in seeds]
    assert np.array(info["votes"]).sum(axis=1).tolist() == [3, 3]
    table = (out / "votes.md").read_text()
    assert f"agreement {expected.agreement:.0%}" in table and "| block1 |" in table
    assert f"agreement: {expected.agreement:.0%} of sites" in proc.stdout
    acc = event_tags(out)
    assert {"consensus/agreement", "votes/block0/pre", "votes/block1/deepnorm"} <= set(acc.Tags()["scalars"])
    # experiments/fidelity/selection_variants.py re-runs only the selection from a seed's checkpoint: its
    # `random` variant is the default selection and gives that seed's genotype again, exactly
    variants = experiment_script("fidelity/selection_variants")
    # (with the thread count the seed's worker had: float sums in another order move the 6th decimal)
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    try:
        again0 = variants.reselect(out / "seed0", tmp_path / "sel" / "random" / "seed0", "random")
        one_shot = variants.reselect(out / "seed0", tmp_path / "sel" / "one-shot" / "seed0", "one-shot").provenance["selection"]
        top_down = variants.reselect(out / "seed0", tmp_path / "sel" / "top-down" / "seed0", "top-down").provenance["selection"]
    finally:
        torch.set_num_threads(threads)
    assert again0.placements == seeds[0].placements
    assert again0.provenance["selection"]["loss_rises"] == seeds[0].provenance["selection"]["loss_rises"]
    assert one_shot["fine_tuning_updates"] == 0 and one_shot["order"] == ["block0", "block1"] and one_shot["windows"] == 128
    assert top_down["order"] == ["block1", "block0"] and top_down["fine_tuning_updates"] == 2
    # a re-run reuses the seeds and refuses to overwrite the finished consensus without --overwrite
    again = run("search.py", "--config", TINY, "--seeds", "3", "--out", str(out), cache=cache_dir, check=False)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    # an interrupted consensus whose seeds are finished is not finished with other settings
    (out / "genotype.json").unlink()
    stale = run("search.py", "--config", TINY, "--seeds", "2", *short, "--set", "search.steps=11", "--out", str(out),
                cache=cache_dir, check=False)
    assert stale.returncode == 2 and "search.steps (12 -> 11)" in stale.stderr and "--overwrite" in stale.stderr
    # --overwrite removes the old consensus and every old seed folder
    run("search.py", "--config", TINY, "--seeds", "2", *short, "--set", "search.steps=2", "--set", "search.warmup_steps=1", "--set", "search.eval_every=2",
        "--set", "search.arch_warmup_steps=0", "--out", str(out), "--overwrite", cache=cache_dir)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("events")) == ["genotype.json", "seed0", "seed1", "votes.md"]
    assert len(list(out.glob("events.out.tfevents.*"))) == 1
    # another command's finished run is not a consensus folder
    other = tmp_path / "retrain"
    other.mkdir()
    (other / "metrics.json").write_text("{}")
    refused = run("search.py", "--config", TINY, "--seeds", "2", "--out", str(other), cache=cache_dir, check=False)
    assert refused.returncode == 2 and "metrics.json" in refused.stderr


def test_seeds_refuses_bad_counts(tmp_path, cache_dir):
    proc = run("search.py", "--seeds", "1", "--out", str(tmp_path / "x"), cache=cache_dir, check=False)
    assert proc.returncode == 2 and "--seeds must be at least 2" in proc.stderr
    proc = run("search.py", "--seeds", "2", "--tune", cache=cache_dir, check=False)
    assert proc.returncode == 2 and "give one of them" in proc.stderr

