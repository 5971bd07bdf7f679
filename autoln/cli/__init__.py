"""TODO face of cli."""

from autoln.cli._cli import (  # noqa: F401
    CONFIG_SECTIONS,
    DEFAULT_BASELINES,
    EXIT_DIVERGED,
    EXIT_OUT_OF_MEMORY,
    EXIT_WORKER_DIED,
    OneLineParser,
    guarded,
    invoked_as,
    number,
    retrain_main,
    search_main,
    set_hint,
)
