"""The run-level sections and the whole configuration: the Optuna outer loop
(:class:`TuneConfig`, with what ``tune.space`` may hold and :func:`space_values`, its check), the
race (:class:`RaceConfig`), checkpoints (:class:`CheckpointConfig`), logging
(:class:`LoggingConfig`), and :class:`Config`, the resolved configuration of one run, with
:func:`assign`, which sets one ``section.key`` of it from a YAML value.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from autoln.config.sections import (DataConfig, ModelConfig, RetrainConfig, SearchConfig, _non_negative, _one_of,
                                    _positive)
from autoln.config.values import _coerce, _type_name
from autoln.core.errors import ConfigError, cut, quoted

#: Most corners of ``tune.space`` that :meth:`Config.validate_space` checks together.
MAX_CORNERS = 4096
DISTRIBUTIONS = ("log-uniform", "uniform", "int", "categorical")
TUNABLE_SECTIONS = ("data", "model", "search", "retrain")
#: Keys a study may not tune: they change what the score measures (data, splits, the windows it
#: is computed on), where it runs, or are set by the tuner itself (``tune.proxy_steps``).
UNTUNABLE = ("data.corpus", "data.tokenizer", "data.valid_fraction", "data.test_fraction", "data.cache_dir",
             "search.device", "retrain.device", "retrain.steps", "retrain.final_eval_windows")
SCORES = ("proxy_retrain", "supernet")
PRUNERS = ("median", "hyperband", "none")
SAMPLERS = ("tpe", "random")


def _default_space() -> dict[str, dict]:
    return {
        "search.arch_lr": {"log-uniform": [1.0e-4, 3.0e-2]},
        "search.lr": {"log-uniform": [5.0e-4, 5.0e-3]},
        "search.arch_warmup_steps": {"int": [0, 100], "step": 25},
        "search.tau_start": {"log-uniform": [0.5, 5.0]},
        "search.beta_reg_max": {"uniform": [0.0, 10.0]},
        "search.order": {"categorical": [1, 2]},
    }


@dataclass
class TuneConfig:
    """The Optuna outer loop of ``search.py --tune`` (docs/design.md §5).

    - ``n_trials``: cap on the study's finished trials (complete, pruned or failed by their
      own error), across every worker and machine; trials lost with a killed worker do not
      count and are re-run (at most ``max_retry`` times each).
    - ``score``: what a trial minimises: ``proxy_retrain`` (the derived genotype's valid loss,
      in the headline unit, after a ``proxy_steps``-step retrain with the ``retrain``
      settings) or ``supernet`` (the supernet's final valid loss).
    - ``pruner``: ``median`` | ``hyperband`` | ``none``, fed the valid loss at every
      evaluation of the search and of the proxy retrain; ``startup_trials``: trials before
      the median pruner or TPE act.
    - ``sampler``: ``tpe`` (multivariate, constant liar) | ``random``; seeded with
      ``seed + rank`` where a worker's rank is ``rank_offset`` plus its index on this machine.
    - ``storage``: ``null`` (Optuna's journal file ``study.journal`` in the study folder) or an
      RDB URL (``sqlite:///tune.db``, ``postgresql+psycopg2://user@host/db``); ``study_name`` names the
      study in it. RDB storages use a heartbeat every ``heartbeat_interval`` s; a trial
      silent for ``grace_period`` s is failed and re-run.
    - ``space``: ``{"section.key": {distribution: [low, high]}}`` with distribution
      ``log-uniform`` | ``uniform`` | ``int`` (optional ``step``) | ``categorical`` (a list of
      choices); keys are any ``data``/``model``/``search``/``retrain`` key.
    """

    n_trials: int = 20
    score: str = "proxy_retrain"
    proxy_steps: int = 200
    pruner: str = "median"
    sampler: str = "tpe"
    startup_trials: int = 5
    seed: int = 0
    rank_offset: int = 0
    storage: Optional[str] = None
    study_name: str = "autoln"
    heartbeat_interval: int = 10
    grace_period: int = 60
    max_retry: int = 2
    space: dict[str, dict] = field(default_factory=_default_space)

    def validate(self) -> None:
        for key in ("n_trials", "proxy_steps", "heartbeat_interval", "grace_period"):
            _positive(f"tune.{key}", getattr(self, key))
        _non_negative(self, "tune", ("startup_trials", "max_retry", "rank_offset"))
        _one_of("tune.score", self.score, SCORES)
        _one_of("tune.pruner", self.pruner, PRUNERS)
        _one_of("tune.sampler", self.sampler, SAMPLERS)
        if not 0 <= self.seed < 2**31:
            raise ConfigError(f"tune.seed must be in [0, 2^31), got {self.seed}")
        if self.grace_period <= self.heartbeat_interval:
            raise ConfigError(f"tune.grace_period ({self.grace_period}) must exceed tune.heartbeat_interval ({self.heartbeat_interval})")
        if self.storage is not None and "://" not in self.storage:
            raise ConfigError(f"tune.storage must be null (a journal file in the study folder) or an RDB URL such as "
                              f"sqlite:///tune.db or postgresql+psycopg2://user@host/db, got {quoted(self.storage)}")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.study_name):
            raise ConfigError(f"tune.study_name must be letters, digits, '.', '_' or '-' (not starting with '.'), "
                              f"got {quoted(self.study_name)}")
        if not self.space:
            raise ConfigError("tune.space must name at least one key to tune")


@dataclass
class RaceConfig:
    """The race that decides ``search.py``'s answer (docs/design.md §10, :mod:`autoln.race.rule`): the
    supernet's read-off, its argmax and its ``top_k`` whole genotypes by one-hot score race the
    named placements of the searched candidates in real retrains (the ``retrain`` settings),
    synchronous successive halving with ``eta`` and ``rungs`` ending at ``retrain.steps``, the
    finalists seed by seed (``retrain.seed`` + 0, 1, ...) from ``final_seeds`` to ``max_seeds``
    seeds; a searched finalist is the answer only if it beats the best named one by a
    group-sequential one-sided paired t-test whose false-win rate over all looks is ``level``
    (``spending``: the alpha-spending function, :mod:`autoln.race.sequential`). ``horizons``:
    multiples of ``retrain.steps`` at which the two finalists are also retrained (``final_seeds``
    seeds each) when the searched one led, so the verdict says whether the lead lasts.
    ``proposer`` (``none``, ``random``, ``prior``, ``local``, ``ridge``, ``tpe``, ``gp``:
    :mod:`autoln.race.propose`): after the shortlist's rungs, rounds of ``proposals`` genotypes
    the proposer picks from every retrain measured so far run the same rungs, while the searched
    entries' retrains stay within ``budget`` full-budget retrains (``random``: random genotypes
    from the first round, no supernet entry: random search through the same race).
    ``enabled: false`` gives the supernet's answer alone (no retrain). The race's study lives on
    ``tune.storage`` (or a journal file in ``<search folder>/race``)."""

    enabled: bool = True
    top_k: int = 3
    eta: int = 3
    rungs: int = 3
    final_seeds: int = 3
    level: float = 0.05
    max_seeds: int = 6
    spending: str = "obrien-fleming"
    horizons: list[int] = field(default_factory=lambda: [1])
    proposer: str = "none"
    budget: float = 7.0
    proposals: int = 5

    def validate(self) -> None:
        _non_negative(self, "race", ("top_k", "budget"))
        _positive("race.proposals", self.proposals)
        _one_of("race.proposer", self.proposer, ("none", "random", "prior", "local", "ridge", "tpe", "gp"))
        _positive("race.rungs", self.rungs)
        if self.eta < 2:
            raise ConfigError(f"race.eta must be at least 2 (each rung keeps 1/eta of its entries), got {self.eta}")
        if self.final_seeds < 2:
            raise ConfigError(f"race.final_seeds must be at least 2 (the verdict is a paired test over seeds), got {self.final_seeds}")
        if not 0 < self.level < 0.5:
            raise ConfigError(f"race.level must be in (0, 0.5) (the final's false-win rate, e.g. 0.05), got {self.level}")
        if self.max_seeds < self.final_seeds:
            raise ConfigError(f"race.max_seeds must be at least race.final_seeds ({self.final_seeds}: the final's first look), "
                              f"got {self.max_seeds}")
        _one_of("race.spending", self.spending, ("obrien-fleming", "pocock"))
        if not self.horizons or self.horizons[0] != 1 or any(b <= a for a, b in zip(self.horizons, self.horizons[1:])):
            raise ConfigError(f"race.horizons must be increasing multiples of retrain.steps starting at 1, e.g. [1, 4], "
                              f"got {self.horizons}")


@dataclass
class CheckpointConfig:
    """``every``: steps between checkpoints of a search or retrain (besides those at each
    evaluation, at the end and on SIGINT/SIGTERM); 0 for none but those."""

    every: int = 100

    def validate(self) -> None:
        if self.every < 0:
            raise ConfigError(f"checkpoint.every must be >= 0 (0: only at evaluations and on signals), got {self.every}")


@dataclass
class LoggingConfig:
    """``tensorboard``: write the run's pictures in its folder: TensorBoard event files and, for
    a search, ``alphas.png`` and ``alphas_heatmap.png`` (off: neither, the quickest runs);
    ``progress``: show progress, as a
    tqdm bar on a terminal and, when stderr is redirected to a file, as one line per evaluation
    (a bar there would add a line per redraw); ``false`` shows neither. ``log_every``: steps
    between training-loss scalars."""

    tensorboard: bool = True
    progress: bool = True
    log_every: int = 10

    def validate(self) -> None:
        _positive("logging.log_every", self.log_every)


@dataclass
class Config:
    """The resolved configuration of one run: the sections above."""

    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    retrain: RetrainConfig = field(default_factory=RetrainConfig)
    tune: TuneConfig = field(default_factory=TuneConfig)
    race: RaceConfig = field(default_factory=RaceConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def validate(self) -> None:
        """Check every value's range, and that each ``tune.space`` entry names a known key
        with a well-formed distribution; raises :class:`ConfigError` naming the key."""
        self.data.validate()
        self.model.validate()
        self.search.validate()
        self.retrain.validate()
        self.tune.validate()
        self.race.validate()
        self.checkpoint.validate()
        self.logging.validate()
        for key, spec in self.tune.space.items():
            space_values(key, spec, self)

    def validate_space(self) -> None:
        """For ``search.py --tune``: check that every bound and choice of ``tune.space``, set
        alone on this config, gives a valid config (so a study does not start with a space
        whose every trial would fail).

        Then every corner of the space (each combination of bounds and choices, up to
        :data:`MAX_CORNERS`) is checked the same way, for rules that tie two tuned keys.

        Raises:
            ConfigError: naming the ``tune.space`` entry (or entries), the value and the problem.
        """
        values = {key: space_values(key, spec, self) for key, spec in self.tune.space.items()}
        for key, choices in values.items():
            for value in choices:
                try:
                    self._trial({key: value}).validate_sections()
                except ConfigError as exc:
                    raise ConfigError(f"tune.space['{cut(key)}']: the value {quoted(value)} is invalid: {exc} "
                                      f"[change that range in tune.space: --set of a tuned key has no effect]") from None
        # then the corners of the space, where two tuned keys together can break a rule
        # (e.g. search.arch_warmup_steps at its top with search.steps at its bottom)
        if len(values) > 1 and math.prod(len(v) for v in values.values()) <= MAX_CORNERS:
            for combo in itertools.product(*values.values()):
                params = dict(zip(values, combo))
                try:
                    self._trial(params).validate_sections()
                except ConfigError as exc:
                    shown = ", ".join(f"{cut(k)}={quoted(v)}" for k, v in params.items())
                    raise ConfigError(f"tune.space: a trial could draw {shown}, which is invalid: {exc} "
                                      f"[narrow these ranges in tune.space]") from None

    def _trial(self, params: dict) -> "Config":
        trial = copy.deepcopy(self)
        trial.tune.space = {}
        for key, value in params.items():
            assign(trial, key, value, "tune.space")
        return trial

    def validate_sections(self) -> None:
        """Validate the sections a trial changes (data, model, search, retrain)."""
        self.data.validate()
        self.model.validate()
        self.search.validate()
        self.retrain.validate()

    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict (tuples become lists), suitable for YAML and JSON."""
        return _plain(dataclasses.asdict(self))

    def to_yaml(self) -> str:
        """The resolved config as YAML text (the content of a run's ``config.yaml``)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# --- helpers -----------------------------------------------------------------------------


def space_values(key: str, spec: Any, cfg: Config) -> list[Any]:
    """Check one ``tune.space`` entry and return the values that bound it: ``[low, high]`` of
    a range, or every choice of a ``categorical``.

    Raises:
        ConfigError: ``key`` is not ``section.key`` of a tunable section, ``spec`` is not a
            mapping with exactly one of :data:`DISTRIBUTIONS` (plus ``step`` for ``int`` and
            ``uniform``), bounds are not numbers with low < high (low > 0 for log-uniform),
            a bound does not fit the key's type, or the key is in :data:`UNTUNABLE`.
    """
    where = f"tune.space['{cut(key)}']"
    section = key.split(".")[0]
    if section not in TUNABLE_SECTIONS or key.count(".") != 1:
        raise ConfigError(f"{where}: keys must be section.key with section one of {list(TUNABLE_SECTIONS)}")
    obj = getattr(cfg, section)
    name = key.split(".")[1]
    hints = typing.get_type_hints(type(obj))
    if name not in hints:
        raise ConfigError(f"{where}: unknown key; keys of '{section}': {', '.join(f.name for f in dataclasses.fields(obj))}")
    if key in UNTUNABLE:
        raise ConfigError(f"{where}: {key} cannot be tuned (it changes what the score measures or is set by the "
                          f"tuner; not tunable: {', '.join(UNTUNABLE)})")
    if key == "search.steps" and cfg.tune.pruner != "none":
        raise ConfigError(f"{where}: a tuned search length cannot be pruned fairly (the pruner compares trials at equal "
                          f"steps, and a shorter search is behind there only for being shorter); tune it with "
                          f"--set tune.pruner=none (now {quoted(cfg.tune.pruner)}), or fix search.steps and tune the rest")
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a mapping such as {{log-uniform: [1.0e-4, 1.0e-2]}}, got {quoted(spec)}")
    kinds = [k for k in spec if k in DISTRIBUTIONS]
    extra = [k for k in spec if k not in DISTRIBUTIONS and k != "step"]
    if len(kinds) != 1 or extra:
        raise ConfigError(f"{where} must have exactly one of {list(DISTRIBUTIONS)} (and optionally step), got keys {quoted(list(spec))}")
    kind, args = kinds[0], spec[kinds[0]]
    if "step" in spec and kind not in ("int", "uniform"):
        raise ConfigError(f"{where}: step is only for int and uniform")
    if kind == "categorical":
        if not isinstance(args, list) or not args:
            raise ConfigError(f"{where}: categorical needs a non-empty list of choices, got {quoted(args)}")
        for choice in args:
            if not (choice is None or isinstance(choice, (bool, int, float, str))):
                raise ConfigError(f"{where}: categorical choices must be numbers, strings, booleans or null, got {quoted(choice)}")
        if len(set(map(repr, args))) != len(args):
            raise ConfigError(f"{where}: categorical choices repeat: {quoted(args)}")
        return [_coerce(c, hints[name], key, where) for c in args]
    if (not isinstance(args, list) or len(args) != 2
            or not all(isinstance(a, (int, float)) and not isinstance(a, bool) and math.isfinite(a) for a in args)):
        raise ConfigError(f"{where}: {kind} needs [low, high] as two finite numbers, got {quoted(args)}")
    if kind == "int":  # integral numbers written as 1e3 are integers
        args = [int(a) if isinstance(a, float) and a.is_integer() else a for a in args]
    low, high = args
    if not low < high:
        raise ConfigError(f"{where}: low ({low}) must be below high ({high})")
    if kind == "log-uniform" and low <= 0:
        raise ConfigError(f"{where}: log-uniform needs low > 0, got {low}")
    base = hints[name]
    if typing.get_origin(base) in (typing.Union, types.UnionType):
        base = [a for a in typing.get_args(base) if a is not type(None)][0]
    if kind == "int":
        if base is not int or not all(isinstance(a, int) for a in args):
            raise ConfigError(f"{where}: int needs an integer key and integer bounds ({key} is {_type_name(hints[name])})")
        step = spec.get("step", 1)
        step = int(step) if isinstance(step, float) and step.is_integer() else step
        if not isinstance(step, int) or isinstance(step, bool) or step <= 0 or (high - low) % step:
            raise ConfigError(f"{where}: step must be a positive integer dividing high - low, got {quoted(step)}")
    else:
        if base is not float:
            raise ConfigError(f"{where}: {kind} needs a number key ({key} is {_type_name(hints[name])}); use int or categorical")
        step = spec.get("step")
        if step is not None:
            n = (high - low) / step if isinstance(step, (int, float)) and not isinstance(step, bool) and step > 0 else 0.0
            if kind != "uniform" or n < 1 or abs(n - round(n)) > 1e-9 * max(1.0, n):
                raise ConfigError(f"{where}: step must be a positive number that divides high - low, got {quoted(step)}")
    return [_coerce(a, hints[name], key, where) for a in args]


def assign(cfg: Config, dotted: str, value: Any, where: str) -> None:
    """Set ``cfg.<section>.<key>`` from a YAML value, coerced to the field's type.

    Raises:
        ConfigError: unknown section or key, or a value of the wrong type (names the key and
            ``where`` it came from).
    """
    _assign(cfg, dotted, value, where)


def _assign(cfg: Config, dotted: str, value: Any, where: str) -> None:
    parts = dotted.split(".")
    sections = [f.name for f in dataclasses.fields(Config)]
    if len(parts) != 2:
        raise ConfigError(f"key '{cut(dotted)}' ({where}) must have the form section.key")
    section, key = parts
    if section not in sections:
        import difflib

        close = difflib.get_close_matches(section, sections, n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise ConfigError(f"unknown section '{cut(section)}' ({where}); {hint}expected one of {sections}")
    obj = getattr(cfg, section)
    hints = typing.get_type_hints(type(obj))
    known = [f.name for f in dataclasses.fields(obj)]
    if key not in known:
        import difflib

        close = difflib.get_close_matches(key, known, n=1)
        hint = f"did you mean '{section}.{close[0]}'? " if close else ""
        raise ConfigError(f"unknown key '{cut(dotted)}' ({where}); {hint}keys of '{section}': {', '.join(known)}")
    setattr(obj, key, _coerce(value, hints[key], dotted, where))


def _plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj
