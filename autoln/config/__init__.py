"""TODO face of config."""

from autoln.config._config import (  # noqa: F401
    AFFINES,
    CANDIDATE_SCALES,
    Config,
    DataConfig,
    GRANULARITIES,
    MAX_STRING,
    ModelConfig,
    PLACE_KEYS,
    R_DARTS_LAG,
    R_DARTS_MIN_EVALUATIONS,
    R_DARTS_START_FRACTION,
    RetrainConfig,
    SELECTIONS,
    SearchConfig,
    TrainConfig,
    assign,
    load_config,
    read_yaml,
    space_values,
    with_defaults,
)
