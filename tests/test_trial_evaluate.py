"""The checks before any training of ``compare_genotypes`` and ``race_genotypes``: those that need
no user code come before ``build()`` is first called, and the trial call of the user's
``evaluate`` on an untrained model lets be an ``evaluate`` that cannot run before training (as
``experiments/race/own_model_race.py``'s, which reads a value its ``train`` sets), naming what it
raised in one line as the user's evaluate's."""

from __future__ import annotations

import pytest

import autoln

from .test_api_misuse import Tiny, _batches, _site_genotype

NOTE = ("{where}: note: a trial call of your evaluate on an untrained model, before any training, raised AttributeError: "
        "'Tiny' object has no attribute 'autoln_value'; it is checked on the first trained model instead\n")


def _train(model, seed, steps=1):
    model.autoln_value = 2.0 + seed + steps / 1000  # what the user's loop measured


def test_compare_lets_an_evaluate_that_needs_training_be_and_names_what_it_raised(capsys):
    result = autoln.compare_genotypes(Tiny, _site_genotype(Tiny(), "post"), baselines=["pre"], seeds=2, train=_train,
                                      evaluate=lambda model: model.autoln_value, progress=False)
    assert result.row("searched").values == [2.001, 3.001] and result.row("all-pre").values == [2.001, 3.001]
    assert capsys.readouterr().err == NOTE.format(where="autoln.compare_genotypes")


def test_race_lets_an_evaluate_that_needs_training_be_and_names_what_it_raised(capsys):
    searched = {"mine": _site_genotype(Tiny(), "post")}
    race = autoln.race_genotypes(Tiny, searched, train=_train, evaluate=lambda model: model.autoln_value, steps=9,
                                 baselines=["all-lns"], progress=False)
    assert race.values[("all-pre", 9, 0)] == 2.009 and race.genotype.describe().split() == ["pre"] * 4
    assert capsys.readouterr().err == NOTE.format(where="autoln.race_genotypes")


def test_compare_refuses_batches_it_cannot_reuse_before_calling_build():
    built = []

    def build():
        built.append(1)
        return Tiny()

    with pytest.raises(ValueError, match="autoln.compare_genotypes: train_batches: expected a list or a DataLoader"):
        autoln.compare_genotypes(build, None, baselines=["pre"], train_batches=iter(_batches()), valid_batches=_batches())
    with pytest.raises(ValueError, match="autoln.compare_genotypes: pass valid_batches"):
        autoln.compare_genotypes(build, None, baselines=["pre"], train_batches=_batches())
    assert built == []
