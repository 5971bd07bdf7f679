"""Loading the configuration (one dataclass per section) from YAML with ``--set`` overrides, and
reading the configs that runs recorded (:func:`with_defaults`, :func:`earlier_behaviour`).

A config file has the sections ``data``, ``model``, ``search``, ``retrain``, ``tune``,
``checkpoint`` and ``logging`` (every section and key is optional; missing ones take the defaults of
:mod:`autoln.config.sections` and :mod:`autoln.config.runs`, which are the CPU defaults of
``configs/search.yaml``). One file serves ``search.py`` (and its ``--tune``
outer loop) and ``retrain.py``.

Overrides are ``section.key=value`` strings whose value is parsed as YAML, e.g.
``--set search.steps=200`` or ``--set model.candidates=[pre,post]``.

Errors: every problem raises :class:`autoln.core.errors.ConfigError` naming the key
(``model.d_model``) and, for files, the file.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from autoln.config.runs import Config, _assign
from autoln.config.sections import R_DARTS_LAG, R_DARTS_MIN_EVALUATIONS, R_DARTS_START_FRACTION
from autoln.core.errors import ConfigError, cut, quoted

#: Characters of YAML the resolved config of a file and ``--set`` may take (the defaults take
#: about 2,000; a long ``tune.space`` a few thousand): checked after validation, naming the
#: largest key, so no list (``tune.space`` choices) makes every run's copies large.
MAX_CONFIG_YAML = 65_536


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader with two changes: a key given twice in one mapping is an error
    (PyYAML keeps the last silently, so ``model:`` written twice would drop the first section;
    a merge key's ``<<: *anchor`` keys are merged as YAML merges them, the mapping's own winning),
    and numbers are read as YAML 1.2 reads them (:data:`YAML12_FLOAT`: ``1e-4`` and ``3E5`` are
    numbers, where PyYAML's YAML 1.1 resolver reads a float without a dot as a string)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *anchor``: merged as YAML merges it, its keys overridable
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {quoted(key)}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


#: A YAML 1.2 float as written (the core schema's, with YAML 1.1's ``_`` separators): with a dot, or
#: with an exponent and no dot (``1e-4``, ``2E+3``), or ``.5``; PyYAML's own resolver, tried first, keeps
#: ``.inf``, ``.nan`` and the sexagesimal forms.
YAML12_FLOAT = re.compile(r"""^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                                     |[0-9][0-9_]*[eE][-+]?[0-9]+
                                     |\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?)$""", re.X)
_UniqueKeyLoader.add_implicit_resolver("tag:yaml.org,2002:float", YAML12_FLOAT, list("-+0123456789."))


def read_yaml(text: str) -> Any:
    """YAML text as Python values, with :class:`_UniqueKeyLoader` (numbers as YAML 1.2 reads
    them, duplicate keys refused): config files, ``--set`` values and the runs' own
    ``config.yaml`` all go through it.

    Raises:
        yaml.YAMLError: invalid YAML or a duplicate key; ValueError: an integer of more than
            4,300 digits (Python's limit for ``int()``)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


#: Keys added with a default that changed what earlier runs did: a record without the key was
#: made the earlier way, so :func:`with_defaults` fills in that value, not today's default.
EARLIER_BEHAVIOUR = {("model", "residual_init"): "unscaled"}


def with_defaults(recorded: dict) -> dict:
    """A config dict recorded by an earlier run (checkpoint, genotype provenance, comparison
    record), with every key added since then at its built-in default (or, for a key in
    :data:`EARLIER_BEHAVIOUR`, at what runs did before the key existed), so that comparing it
    with today's config reports real differences only. Sections and keys it holds are kept."""
    out = Config().to_dict()
    for (section, key), value in EARLIER_BEHAVIOUR.items():
        if isinstance(recorded.get(section), dict) and key not in recorded[section]:
            out[section][key] = value
    for section, values in recorded.items():
        if isinstance(values, dict) and isinstance(out.get(section), dict):
            out[section] = {**out[section], **values}
        else:
            out[section] = values
    return out


#: Keys that say only where and how fast a run goes, not what it computes: the device, the
#: compiler, the mixed precision and the token cache's folder. A checkpoint is portable between
#: a GPU and a CPU, so ``--resume`` lets these change (:func:`autoln.engine.checkpoint.resume_differences`),
#: and a finished retrain made on another device stands for this one (:mod:`autoln.engine.folders`).
PLACE_KEYS = ("data.cache_dir", "search.device", "search.compile", "search.precision",
              "retrain.device", "retrain.compile", "retrain.precision")

#: Files a finished or interrupted run leaves beside its ``config.yaml`` (:func:`is_run_config`).
RUN_RECORDS = ("checkpoint.pt", "metrics.json", "genotype.json")


def is_run_config(path: str | Path) -> bool:
    """True when ``path`` is a run's own ``config.yaml``: a file of that name in a folder that
    also holds one of :data:`RUN_RECORDS`. Such a file records what the run did, so a key it
    lacks (it was written before the key existed) means the earlier behaviour, not today's
    default (:func:`earlier_behaviour`)."""
    path = Path(path)
    return path.name == "config.yaml" and any((path.parent / name).is_file() for name in RUN_RECORDS)


def earlier_behaviour(raw: dict, path: str | Path) -> dict:
    """``raw`` (a run's own config file, :func:`is_run_config`) with each key of
    :data:`EARLIER_BEHAVIOUR` that its section lacks set to what runs did before the key
    existed, as :func:`with_defaults` reads checkpoints and records; a ``note:`` line names each.
    So the remedy printed on ``--resume`` ("resume with the run's own config") works for a run
    older than the key."""
    out = {section: (dict(values) if isinstance(values, dict) else values) for section, values in raw.items()}
    for (section, key), value in EARLIER_BEHAVIOUR.items():
        if isinstance(out.get(section), dict) and key not in out[section]:
            out[section][key] = value
            _note(f"note: {path} has no {section}.{key} (the run is older than the key): read as {value!r}, what runs "
                  "did before it existed", file=sys.stderr)
    return out


def _note(text: str, file=None) -> None:
    """Print a ``note:`` line to stderr, once under ``torchrun`` (on rank 0, from the ``RANK``
    variable: the notes come before the process group exists)."""
    if os.environ.get("RANK", "0") == "0":
        print(text, file=file or sys.stderr)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a :class:`Config` from defaults, an optional YAML file and ``--set`` overrides.

    Args:
        path: YAML file with any of the sections; ``None`` for the defaults. A run's own
            ``config.yaml`` (:func:`is_run_config`) reads a key it lacks as the earlier
            behaviour (:func:`earlier_behaviour`).
        overrides: strings ``section.key=value``; ``value`` is parsed as YAML.

    Raises:
        ConfigError: unreadable or non-mapping file, unknown section or key, wrong type or
            out-of-range value, a string over :data:`MAX_STRING` characters, a resolved config
            over :data:`MAX_CONFIG_YAML` characters of YAML (:func:`check_size`); the message
            names the key and the file or ``--set``, and quotes values bounded
            (:func:`autoln.core.errors.quoted`).
    """
    raw: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start})") from None
        try:
            loaded = read_yaml(text)
        except ValueError as exc:  # an integer of more than 4,300 digits (Python's limit for int())
            raise ConfigError(f"config file {path} is not valid YAML: {cut(str(exc), 120)}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where_in = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise ConfigError(f"config file {path} is not valid YAML{where_in}: {cut(problem)}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(loaded).__name__}")
        raw = earlier_behaviour(loaded, path) if is_run_config(path) else loaded
    cfg = Config()
    given: dict[str, str] = {}  # section.key -> where it was set
    for section, values in raw.items():
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"section '{cut(section)}' in {where} must be a mapping of keys")
        for key, value in values.items():
            _assign(cfg, f"{section}.{key}", value, where)
            given[f"{section}.{key}"] = where
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"--set expects section.key=value, got '{cut(item)}'")
        dotted, text = item.split("=", 1)
        try:
            value = read_yaml(text) if text.strip() else None
        except (yaml.YAMLError, ValueError):  # ValueError: an integer of more than 4,300 digits
            value = text
        _assign(cfg, dotted.strip(), value, "--set")
        given[dotted.strip()] = "--set"
    # chosen by the user: every --set, and a file's values other than the defaults (a run's own
    # config.yaml lists every key, its defaults included)
    default = Config()
    chosen = {k: w for k, w in given.items() if w == "--set"
              or getattr(getattr(cfg, k.split(".")[0]), k.split(".")[1]) != getattr(getattr(default, k.split(".")[0]), k.split(".")[1])}
    fit_defaults(cfg, chosen)
    cfg.validate()
    check_size(cfg, where + (" and --set" if overrides else ""))
    return cfg


def check_size(cfg: Config, where: str) -> None:
    """Refuse a resolved config whose YAML is over :data:`MAX_CONFIG_YAML` characters: every run
    copies it (``config.yaml``, checkpoints, TensorBoard text, a genotype's provenance), and no
    setting needs that much. Each string is already at most :data:`MAX_STRING` characters; what
    remains is a long list, such as ``tune.space`` choices.

    Raises:
        ConfigError: naming ``where`` (the file and/or ``--set``), the size and the largest key.
    """
    size = len(cfg.to_yaml())
    if size <= MAX_CONFIG_YAML:
        return
    sizes = {f"{section}.{key}": len(yaml.safe_dump(value)) for section, values in cfg.to_dict().items() for key, value in values.items()}
    largest = max(sizes, key=sizes.get)
    raise ConfigError(f"the config ({where}) is {size:,} characters of YAML, more than the {MAX_CONFIG_YAML:,} "
                      f"a run copies into its outputs; the largest key is {largest} ({sizes[largest]:,} characters): shorten it")


def fit_defaults(cfg: Config, chosen: dict[str, str]) -> None:
    """Make the keys the user left at their built-in defaults agree with the ones they chose,
    so that a documented option works with every other key at its default (a contradiction
    between two keys the user chose is left for :meth:`Config.validate` to refuse). ``chosen``:
    ``section.key`` -> where it was set: every ``--set``, and a file's keys whose value is not
    the built-in default. In place; prints a note for each key it changes, except the
    temperature that sigmoid mixing does not use.

    - A ``data.corpus`` folder of token files (``train.bin``) is read with ``data.tokenizer: tokens``.
    - ``search.mixing: sigmoid`` has no temperature: ``tau_end`` takes ``tau_start``'s value.
    - A default warm-up (``search.warmup_steps``, ``retrain.warmup_steps``) that is not shorter
      than the run becomes a tenth of its steps; a default ``search.arch_warmup_steps`` (100,
      a fifth of the default 500 steps) that is not below ``search.steps`` becomes a fifth.
    - ``search.early_stop: hessian`` with a default ``search.eval_every`` too sparse for the
      R-DARTS rule evaluates 20 times.

    Raises:
        ConfigError: a key set with ``--set`` that does nothing with the others (selection
            settings of a selection that does not use them; a config file's are left alone,
            as a file serves many runs).
    """
    import sys

    sc = cfg.search
    if "data.tokenizer" not in chosen and (Path(cfg.data.corpus).expanduser() / "train.bin").is_file():
        cfg.data.tokenizer = "tokens"  # a folder of nanoGPT token files is tokenised already
    if sc.mixing == "sigmoid" and not {"search.tau_start", "search.tau_end"} & set(chosen):
        sc.tau_end = sc.tau_start
    fits = [("search", "warmup_steps", 10), ("retrain", "warmup_steps", 10), ("search", "arch_warmup_steps", 5)]
    for section, key, share in fits:
        tc = getattr(cfg, section)
        if f"{section}.{key}" not in chosen and tc.steps >= 1 and getattr(tc, key) >= tc.steps:
            new = tc.steps // share
            _note(f"note: {section}.{key} set to {new}, {'a tenth' if share == 10 else 'a fifth'} of {section}.steps="
                  f"{tc.steps} (its default {getattr(tc, key)} is not shorter than the run; set it to choose another)", file=sys.stderr)
            setattr(tc, key, new)
    if sc.early_stop == "hessian" and "search.eval_every" not in chosen and sc.steps >= 20:
        evals = sorted({*range(sc.eval_every, sc.steps + 1, sc.eval_every), sc.steps})
        if len(evals) < R_DARTS_MIN_EVALUATIONS or len([e for e in evals if e >= R_DARTS_START_FRACTION * sc.steps]) <= R_DARTS_LAG:
            _note(f"note: search.eval_every set to {sc.steps // 20} (20 evaluations; R-DARTS' early stop needs at least "
                  f"{R_DARTS_MIN_EVALUATIONS}, and the default {sc.eval_every} gives {len(evals)})", file=sys.stderr)
            sc.eval_every = sc.steps // 20
    inert = [("search.selection_tune_steps", sc.selection != "perturbation", "only perturbation-based selection fine-tunes"),
             ("search.selection_windows", sc.selection == "argmax", "argmax reads the alphas and measures nothing")]
    for key, idle, why in inert:  # set on the command line for this run (a config file serves many runs and modes)
        if chosen.get(key) == "--set" and idle:
            raise ConfigError(f"{key} ({chosen[key]}) does nothing with search.selection={sc.selection}: {why}; "
                              f"drop it, or choose a selection that uses it")
