"""The configuration of a run: one dataclass per config-file section, read from YAML with
``--set`` overrides, every problem a :class:`autoln.core.errors.ConfigError` naming the key.

- :mod:`autoln.config.sections`: :class:`DataConfig`, :class:`ModelConfig`, :class:`TrainConfig`,
  :class:`SearchConfig`, :class:`RetrainConfig`, their allowed values and checks.
- :mod:`autoln.config.values`: a YAML value as a field's type (:data:`MAX_STRING`).
- :mod:`autoln.config.runs`: the tune, race, checkpoint and logging sections, the whole
  :class:`Config`, :func:`assign` and :func:`space_values`.
- :mod:`autoln.config.load`: :func:`load_config`, :func:`read_yaml`, :func:`with_defaults`, :data:`PLACE_KEYS`.
- :mod:`autoln.config.reference`: docs/configuration.md, generated from the dataclasses.
"""

from autoln.config.load import PLACE_KEYS, load_config, read_yaml, with_defaults
from autoln.config.runs import Config, assign, space_values
from autoln.config.sections import (AFFINES, CANDIDATE_SCALES, GRANULARITIES, R_DARTS_LAG, R_DARTS_MIN_EVALUATIONS,
                                    R_DARTS_START_FRACTION, SELECTIONS, DataConfig, ModelConfig, RetrainConfig,
                                    SearchConfig, TrainConfig)
from autoln.config.values import MAX_STRING

__all__ = [
    "AFFINES",
    "CANDIDATE_SCALES",
    "Config",
    "DataConfig",
    "GRANULARITIES",
    "MAX_STRING",
    "ModelConfig",
    "PLACE_KEYS",
    "R_DARTS_LAG",
    "R_DARTS_MIN_EVALUATIONS",
    "R_DARTS_START_FRACTION",
    "RetrainConfig",
    "SELECTIONS",
    "SearchConfig",
    "TrainConfig",
    "assign",
    "load_config",
    "read_yaml",
    "space_values",
    "with_defaults",
]
