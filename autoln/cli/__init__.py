"""The command lines: ``search.py`` / ``autoln-search`` (:func:`search_main`, module
:mod:`autoln.cli.search_command`) and ``retrain.py`` / ``autoln-retrain`` (:func:`retrain_main`,
:mod:`autoln.cli.retrain_command`), with their shared argument parsing (:mod:`autoln.cli.parsing`,
:mod:`autoln.cli.shared`) and error handling: one-line errors and exit statuses
(:func:`guarded`, :mod:`autoln.cli.guard`)."""

from autoln.cli.guard import EXIT_DIVERGED, EXIT_OUT_OF_MEMORY, EXIT_WORKER_DIED, guarded
from autoln.cli.parsing import CONFIG_SECTIONS, OneLineParser, invoked_as, number, set_hint
from autoln.cli.retrain_command import DEFAULT_BASELINES, retrain_main
from autoln.cli.search_command import search_main

__all__ = [
    "CONFIG_SECTIONS",
    "DEFAULT_BASELINES",
    "EXIT_DIVERGED",
    "EXIT_OUT_OF_MEMORY",
    "EXIT_WORKER_DIED",
    "OneLineParser",
    "guarded",
    "invoked_as",
    "number",
    "retrain_main",
    "search_main",
    "set_hint",
]
