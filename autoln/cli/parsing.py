"""The argument parsing ``search.py`` and ``retrain.py`` share: :class:`OneLineParser` (usage
errors as one line), :func:`set_hint`, the common options (``--config``, ``--set``, ``--out``,
``--overwrite``, ``--resume``), the command's name (:func:`invoked_as`) and :func:`number`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from autoln.cli.guard import EXIT_BAD_INPUT


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line ``error: ...`` (exit 2), like every
    other bad input, instead of the usage block; ``--help`` still prints it. An unrecognized
    ``--<name>`` that is a config key gets the ``--set`` that sets it (:func:`set_hint`)."""

    #: the command's own config section (``search`` or ``retrain``), looked in first for hints
    section: str = "search"

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            hint = set_hint(extras, self.section)
            self.error(f"unrecognized arguments: {' '.join(extras)}" + (f"; {hint}" if hint else ""))
        return parsed

    def error(self, message: str):
        self.exit(EXIT_BAD_INPUT, f"error: {message} (see {self.prog} --help)\n")


def set_hint(extras: list[str], section: str) -> Optional[str]:
    """For unrecognized arguments such as ``--steps 100`` or ``--d-model=64``: ``did you mean
    --set search.steps=100?`` naming every ``--<name>`` that is a config key (dashes read as
    underscores; the command's own ``section`` first, then the others in file order); None
    when no argument is one."""
    import dataclasses

    from autoln.config import Config

    defaults = Config()
    sections = [section] + [f.name for f in dataclasses.fields(Config) if f.name != section]
    keys = {}
    for sec in sections:
        for f in dataclasses.fields(getattr(defaults, sec)):
            keys.setdefault(f.name, f"{sec}.{f.name}")
    sets = []
    for i, tok in enumerate(extras):
        if not tok.startswith("--"):
            continue
        name, eq, value = tok[2:].partition("=")
        key = keys.get(name.replace("-", "_"))
        if key is None:
            continue
        if not eq:
            nxt = extras[i + 1] if i + 1 < len(extras) else None
            value = nxt if nxt is not None and not nxt.startswith("--") else "VALUE"
        sets.append(f"--set {key}={value}")
    return f"did you mean {' '.join(sets)}?" if sets else None


#: The config file's sections (:class:`autoln.config.Config`'s fields), for ``--help``.
CONFIG_SECTIONS = ("data", "model", "search", "retrain", "tune", "race", "checkpoint", "logging")


def number(value: float) -> str:
    """A metric for the terminal: 4 decimals, or 4 significant digits when huge (a blown-up
    perplexity)."""
    return f"{value:.4f}" if abs(value) < 1e6 else f"{value:.4g}"


def invoked_as(script: str) -> str:
    """The command's name as the user typed it: the console script (``autoln-search``,
    ``autoln-retrain``) when run through one, else ``script`` (``search.py``, ``retrain.py``)."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith("autoln-") else script


def _parser(prog: str, description: str, section: str, default_out: str) -> argparse.ArgumentParser:
    p = OneLineParser(prog=invoked_as(prog), description=description)
    p.section = section
    p.add_argument("--config", metavar="FILE", help=f"YAML config (sections {', '.join(CONFIG_SECTIONS)})")
    p.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[],
                   help=f"override one config key, e.g. --set {section}.steps=200 (repeatable)")
    p.add_argument("--out", metavar="DIR", help=f"run folder (default {default_out})")
    p.add_argument("--overwrite", action="store_true", help="reuse an --out folder that holds a finished run")
    return p


def _add_resume(p: argparse.ArgumentParser) -> None:
    p.add_argument("--resume", action="store_true",
                   help="continue the interrupted run in --out from its checkpoint (same command otherwise)")


def _check_resume(p: argparse.ArgumentParser, args: argparse.Namespace, *others: str) -> None:
    if not args.resume:
        return
    if args.overwrite:
        p.error("--resume continues a run and --overwrite starts it again: give one of them")
    if not args.out:
        p.error("--resume needs --out DIR, the folder of the run to continue")
    for option in others:
        if getattr(args, option):
            p.error(f"--resume does not apply to --{option} (re-running that command resumes it)")
