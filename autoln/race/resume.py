"""``search.py --resume`` of a search whose race is to run or to finish (:mod:`autoln.race.run_race`):
the race's journal is repaired or refused in one line before the study opens
(:func:`ready_race_journal`, :mod:`autoln.tune.journal`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from autoln.core.commands import script_line
from autoln.core.errors import OutputError

RACE_DIR = "race"
SUPERNET_FILE = "supernet_genotype.json"
GENOTYPE_FILE = "genotype.json"


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
