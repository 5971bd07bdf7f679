"""Learning-rate schedules after linear warm-up: cosine, inverse square root, constant."""

import math

import pytest

from autoln.config import RetrainConfig, load_config
from autoln.core.errors import ConfigError
from autoln.engine.training import lr_factor


def test_warmup_is_linear_and_reaches_the_peak():
    cfg = RetrainConfig(steps=100, warmup_steps=10, schedule="constant")
    assert lr_factor(0, cfg) == pytest.approx(0.1)
    assert lr_factor(4, cfg) == pytest.approx(0.5)
    assert lr_factor(9, cfg) == 1.0 and lr_factor(10, cfg) == 1.0 and lr_factor(99, cfg) == 1.0


def test_cosine_ends_at_min_ratio_and_is_halfway_in_the_middle():
    cfg = RetrainConfig(steps=110, warmup_steps=10, min_lr_ratio=0.1, schedule="cosine")
    assert lr_factor(10, cfg) == pytest.approx(1.0)
    assert lr_factor(60, cfg) == pytest.approx(0.55)  # (1 + 0.1) / 2
    assert lr_factor(110, cfg) == pytest.approx(0.1)
    assert lr_factor(0, RetrainConfig(steps=10, warmup_steps=0)) == 1.0  # no warm-up: starts at the peak


def test_inverse_sqrt_follows_vaswani():
    cfg = RetrainConfig(steps=1000, warmup_steps=16, schedule="inverse_sqrt")
    assert lr_factor(15, cfg) == 1.0  # end of warm-up: the peak
    assert lr_factor(63, cfg) == pytest.approx(0.5)  # sqrt(16 / 64)
    assert lr_factor(255, cfg) == pytest.approx(0.25)
    no_warmup = RetrainConfig(steps=1000, warmup_steps=0, schedule="inverse_sqrt")
    assert lr_factor(0, no_warmup) == 1.0 and lr_factor(99, no_warmup) == pytest.approx(math.sqrt(1 / 100))


def test_unknown_schedule_names_the_key():
    with pytest.raises(ConfigError, match="retrain.schedule must be one of"):
        load_config(None, ["retrain.schedule=linear"])
