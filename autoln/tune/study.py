"""Reading an Optuna study of ``search.py --tune``: each trial's outcome, the census of the
study's trials and its best trial.

Below both :mod:`autoln.tune` (which runs the study) and :mod:`autoln.tune.report` (which
writes its report), so that the report does not import the runner (tune -> tune_report ->
tune_study, one way).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from autoln.config import Config

#: Outcomes of a trial that ended by itself; they count toward ``tune.n_trials``.
FINISHED_OUTCOMES = ("complete", "pruned", "diverged", "error")


@dataclass
class Census:
    """Trial counts of a study: ``finished`` (count toward ``tune.n_trials``), ``running``,
    ``waiting`` (enqueued re-runs) and ``lost`` (FAIL because their worker died)."""

    finished: int
    running: int
    waiting: int
    lost: int


def _optuna():
    """The ``optuna`` module, with its logging at WARNING and its experimental-feature warnings off."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # Optuna's warnings say what it is waiting on or dropping
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def _headline(cfg: Config) -> str:
    """The name of the headline metric of ``cfg``'s tokenizer (e.g. ``bits_per_byte``)."""
    from autoln.data import HEADLINE

    return HEADLINE[cfg.data.tokenizer]


def outcome(trial) -> str:
    """The outcome of a frozen trial: ``complete``, ``pruned``, ``diverged``, ``error``,
    ``lost`` (FAIL while its worker was running it), ``over-cap``, ``interrupted``,
    ``running`` or ``waiting``."""
    from optuna.trial import TrialState

    attr = trial.user_attrs.get("outcome")
    if trial.state == TrialState.RUNNING:
        return "running"
    if trial.state == TrialState.WAITING:
        return "waiting"
    if trial.state == TrialState.COMPLETE:
        return "complete"
    if trial.state == TrialState.PRUNED:
        return attr if attr in ("pruned", "diverged") else "pruned"
    return "lost" if attr in (None, "running") else attr


def counts_toward_cap(trial) -> bool:
    """True for a trial that ended by itself (complete, pruned, diverged, error)."""
    return outcome(trial) in FINISHED_OUTCOMES


def census(study) -> Census:
    """Count the study's trials by what they mean for the cap."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    return Census(finished=sum(counts_toward_cap(t) for t in trials),
                  running=sum(t.state == TrialState.RUNNING for t in trials),
                  waiting=sum(t.state == TrialState.WAITING for t in trials),
                  lost=sum(outcome(t) == "lost" for t in trials))


def best_trial(study):
    """The complete trial with the lowest value (the study minimises), or None before any completes."""
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    return min(done, key=lambda t: t.value) if done else None
