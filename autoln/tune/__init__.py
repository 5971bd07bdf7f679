"""Optuna tuning of the outer hyperparameters (``search.py --tune``, docs/design.md §5): a study
whose trials are searches with suggested hyperparameters, scored by their derived genotype.

- :mod:`autoln.tune.study`: reading a study: each trial's outcome, the census, the best trial.
- :mod:`autoln.tune.storage`: opening the storage (journal file or RDB) and the study, its
  sampler and pruner, and the check that a resumed study has the same settings.
- :mod:`autoln.tune.objective`: one trial: the search, the proxy retrain or supernet score.
- :mod:`autoln.tune.workers`: the worker loop and the ``--workers`` processes.
- :mod:`autoln.tune.run`: :func:`run_tune`, the command.
- :mod:`autoln.tune.report`: the study's report (trials.md, trials.csv, plots).
"""

from autoln.tune.objective import admitted, write_hparams
from autoln.tune.run import run_tune
from autoln.tune.storage import StorageGone, journal_backend, open_storage, open_study
from autoln.tune.study import census, outcome

__all__ = [
    "StorageGone",
    "admitted",
    "census",
    "journal_backend",
    "open_storage",
    "open_study",
    "outcome",
    "run_tune",
    "write_hparams",
]
