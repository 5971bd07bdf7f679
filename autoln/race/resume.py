"""``search.py --resume`` of a search whose race is to run or to finish (:mod:`autoln.race.run_race`):
what may differ from the settings it was started with, and the words when something does.

- The race's study records its pool, rule and ``data``/``model``/``retrain`` settings
  (:meth:`autoln.race.run_race.RaceSetup.record`); a resume with other ones is refused naming each
  key with both values (``race.final_seeds: 3 then, 2 now``), as ``search.py --resume`` names a
  search's (:func:`autoln.engine.checkpoint.load_for_resume`). Where and how fast the retrains run
  (:data:`autoln.config.PLACE_KEYS`) may change, with a line that says so.
- The finished search's own settings (``data``, ``model``, ``search``, ``race.top_k``: what it
  computed its answer and shortlist with) cannot apply to it any more: a resume with other ones is
  refused the same way (:func:`check_search_kept`), before the race begins.
- ``race.enabled=false`` (or ``torchrun``) on a race stopped before its answer is refused, naming
  the supernet's read-off and the retrains kept (:func:`check_race_off`): it would otherwise
  answer the read-off and leave the race's retrains without a word.
- The race's journal is repaired or refused in one line before the study opens
  (:func:`ready_race_journal`, :mod:`autoln.tune.journal`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

from autoln.config import PLACE_KEYS, Config
from autoln.core.commands import script_line
from autoln.core.errors import ConfigError, OutputError
from autoln.models.genotype import SUPERNET_FILE

RACE_DIR = "race"
GENOTYPE_FILE = "genotype.json"
#: What the race's study record calls a setting of the config (the rule's fields are ``race.*``).
RECORD_KEYS = {"full_steps": "retrain.steps", "seed": "retrain.seed"}
#: The settings of the finished search that the race cannot change (:func:`check_search_kept`).
SEARCH_SECTIONS = ("data", "model", "search")


def flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"section.key": value}`` of a nested dict (a leaf that is not a dict is kept whole)."""
    if not isinstance(tree, dict):
        return {prefix.rstrip("."): tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def then_now(key: str, then: Any, now: Any) -> str:
    """``key: X then, Y now`` (each value's ``repr``, cut to 60 characters)."""
    def shown(value: Any) -> str:
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return f"{key}: {shown(then)} then, {shown(now)} now"


def key_differences(then: dict[str, Any], now: dict[str, Any], default: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The keys of two flat configs whose values differ (a key one side lacks, from another autoln
    version, counts as its value in ``default``), as :func:`then_now` lines: ``(refused, place)``,
    ``place`` those of :data:`autoln.config.PLACE_KEYS`, which may change on a resume."""
    refused, place = [], []
    for key in sorted(set(then) | set(now)):
        a, b = then.get(key, default.get(key)), now.get(key, default.get(key))
        if a != b:
            (place if key in PLACE_KEYS else refused).append(then_now(key, a, b))
    return refused, place


def record_differences(theirs: dict, mine: dict) -> tuple[list[str], list[str]]:
    """How the race record ``mine`` (this command's) differs from ``theirs`` (the study's): the
    settings by name (``race.<rule field>``, ``retrain.steps`` for the full budget, ``data.*``,
    ``model.*``, ``retrain.*``) and the pool's entries, as ``(refused, place)`` of
    :func:`key_differences`."""
    default = flat({k: v for k, v in Config().to_dict().items() if k in ("data", "model", "retrain")})
    refused, place = key_differences(flat(theirs.get("config", {})), flat(mine.get("config", {})), default)
    rule_then, rule_now = theirs.get("rule", {}), mine.get("rule", {})
    refused += key_differences({f"race.{k}": v for k, v in rule_then.items()}, {f"race.{k}": v for k, v in rule_now.items()}, {})[0]
    for key, name in RECORD_KEYS.items():
        if theirs.get(key) != mine.get(key) and not any(line.startswith(name + ":") for line in refused):
            refused.append(then_now(name, theirs.get(key), mine.get(key)))
    if theirs.get("pool") != mine.get("pool"):
        def entries(record: dict) -> str:
            return ", ".join(f"{e.get('name')} = {e.get('placements')}" for e in record.get("pool", []))
        refused.append(f"the pool: {entries(theirs)} then; {entries(mine)} now")
    return refused, place


def compare_record(study, record: dict, folder: Path, name: str, quiet: bool = False) -> None:
    """Set the race ``record`` on a new ``study``, or check it against the one the study holds
    (:func:`record_differences`): a place key that differs is said on stderr (unless ``quiet``).

    Raises:
        ConfigError: the study's race was started with other settings, naming each key with
            both values and the command that resumes it with its own."""
    import dataclasses
    import json

    from autoln.race.rule import RaceRule

    mine = json.loads(json.dumps(record))
    theirs = study.user_attrs.get("race")
    if theirs is None:
        study.set_user_attr("race", mine)
        return
    if isinstance(theirs.get("rule"), dict):  # a race started before a rule setting existed: its default
        defaults = json.loads(json.dumps(dataclasses.asdict(RaceRule())))
        theirs = {**theirs, "rule": {**{k: v for k, v in defaults.items() if k not in theirs["rule"]}, **theirs["rule"]}}
    if theirs == mine:
        return
    refused, place = record_differences(theirs, mine)
    if refused:
        again = script_line("search.py", "--resume", "--out", folder, "--config", folder / "config.yaml")
        raise ConfigError(f"the race of {folder} (study {name}) was started with other settings: {'; '.join(refused)}. "
                          f"Resume it with the search's own config (without the --set of those keys): {again}")
    if place and not quiet:
        print(f"[race] note: the race goes on with {'; '.join(place)} (where and how fast its retrains run; a retrain "
              "continued from its checkpoint is then no longer bitwise equal to an uninterrupted one)", file=sys.stderr)


def check_search_kept(out: Path, cfg: Config) -> None:
    """Before a race runs or goes on after the search in ``out``: the search's own settings
    (:data:`SEARCH_SECTIONS` and ``race.top_k``, from its ``config.yaml``) are ``cfg``'s, but for
    :data:`autoln.config.PLACE_KEYS`. An unreadable ``config.yaml`` is not checked (the command
    then does not take the folder for a search to race).

    Raises:
        ConfigError: a key differs: it cannot apply to a finished search (each key named with
            both values, and the ways on)."""
    import yaml

    from autoln.config import read_yaml, with_defaults

    try:
        saved = with_defaults(read_yaml((out / "config.yaml").read_text(encoding="utf-8")) or {})
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError, TypeError, ValueError):
        return
    now = cfg.to_dict()

    def kept(tree: dict) -> dict:
        picked = flat({k: v for k, v in tree.items() if k in SEARCH_SECTIONS})
        return {**picked, "race.top_k": tree.get("race", {}).get("top_k")}
    refused, _ = key_differences(kept(saved), kept(now), {})
    if refused:
        raise ConfigError(f"--resume: {out} holds a finished search, and settings it was made with cannot change now: "
                          f"{'; '.join(refused)}. Resume with its own config ({out / 'config.yaml'}, without the --set of "
                          "those keys), or search again with them (--overwrite in place of --resume, or another --out)")


def finished_retrains(out: Path) -> int:
    """The race's retrains in ``out/race`` that finished (a ``metrics.json`` in their folder)."""
    return sum(1 for _ in (out / RACE_DIR).glob("*/steps*-seed*/metrics.json"))


def check_race_off(out: Path, why: Optional[str]) -> None:
    """For ``search.py --resume`` without its race (``why``: ``race.enabled=false``, or
    ``torchrun``; None: the race runs): refuse a folder whose race began and has no answer yet
    (``supernet_genotype.json`` without ``genotype.json``): resuming the search there would answer
    the supernet's read-off beside the race's retrains, without a word.

    Raises:
        OutputError: naming the read-off, the retrains kept and the command that finishes the race."""
    if why is None or not (out / SUPERNET_FILE).exists() or (out / GENOTYPE_FILE).exists():
        return
    again = script_line("search.py", "--resume", "--out", out, "--config", out / "config.yaml")
    raise OutputError(f"--resume: {out} holds a race stopped before its answer ({finished_retrains(out)} finished retrain(s) "
                      f"in {out / RACE_DIR}), and {why} cannot finish it. The supernet's read-off alone is "
                      f"{out / SUPERNET_FILE} (retrain.py --genotype takes it); to finish the race, without torchrun and "
                      f"without --set race.enabled=false: {again}")


def ready_race_journal(folder: Path) -> None:
    """Before the race's journal study in ``folder/race`` opens (this command holds the race's
    folder): :func:`autoln.tune.journal.ready_journal`, each line said on stderr.

    Raises:
        OutputError: a damaged record before the journal's last
            (:func:`autoln.tune.journal.damaged_message`)."""
    from autoln.tune.journal import JournalDamaged, ready_journal
    from autoln.tune.storage import JOURNAL_FILE

    try:
        for line in ready_journal(folder / RACE_DIR / JOURNAL_FILE):
            print(f"[race] {line}", file=sys.stderr, flush=True)
    except JournalDamaged as damaged:
        raise OutputError(journal_message(damaged, folder)) from None


def journal_message(damaged, folder: Path) -> str:
    """The one line of the race's damaged journal (:func:`autoln.tune.journal.damaged_message`):
    the finished retrains are read back from their folders when the study starts anew."""
    from autoln.tune.journal import damaged_message

    kept = (f"the race's finished retrains are read back from their folders ({folder / RACE_DIR}/<entry>/steps<S>-seed<i>), "
            "none is retrained; a stopped one goes on from its checkpoint")
    return damaged_message(damaged, kept, script_line("search.py", "--resume", "--out", folder, "--config", folder / "config.yaml"))
