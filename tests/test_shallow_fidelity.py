"""The `shallow` seven-candidate table's noise ceiling (experiments/fidelity/shallow_fidelity.py --ceiling)."""

from __future__ import annotations

import argparse
import csv

import pytest
from scipy.stats import kendalltau

import autoln.retrain.compare
from autoln.oneshot.fidelity import sample_genotypes

from .conftest import ROOT, experiment_script, shared_path

TABLE = ROOT / "experiments" / "retrains.csv"
SEVEN = "pre+post+deepnorm+peri+outnorm+lns+none"


def test_the_ceiling_is_tau_of_the_sample_s_first_twenty_at_seeds_0_and_1_read_from_the_table(tmp_path, monkeypatch):
    """Every retrain is in the repository's table: the ceiling retrains nothing, and equals
    scipy's Kendall tau over the first 20 sampled genotypes' seed-0 and seed-1 rows."""
    corpus = shared_path("wikitext-2")
    fid = experiment_script("fidelity/shallow_fidelity")

    def refuse(*a, **k):
        raise AssertionError("the ceiling retrained a genotype the table holds")

    monkeypatch.setattr(autoln.retrain.compare, "retrain_one", refuse)
    args = argparse.Namespace(config=None, overrides=[f"data.cache_dir={tmp_path / 'cache'}"], data=str(corpus),
                              table=TABLE, out=str(tmp_path / "runs"))
    tau, n = fid.noise_ceiling(20, args)

    with open(TABLE, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if (r["setting"], r["space"], r["steps"]) == ("shallow", SEVEN, "1000")]
    by = {}
    for r in rows:
        by.setdefault(r["genotype"], {})[int(r["seed"])] = float(r["valid"])
    first = [" ".join(g) for g in sample_genotypes(20, 6, SEVEN.split("+"), 0)]
    assert n == 20
    assert tau == pytest.approx(kendalltau([by[g][0] for g in first], [by[g][1] for g in first]).statistic, abs=1e-12)


def test_a_negative_ceiling_is_refused_in_one_line(capsys):
    fid = experiment_script("fidelity/shallow_fidelity")
    with pytest.raises(SystemExit) as exc:
        fid.main(["--ceiling", "-1"])
    assert exc.value.code == 2
    assert "--ceiling: expected a count of genotypes, 0 or more, got -1" in capsys.readouterr().err
