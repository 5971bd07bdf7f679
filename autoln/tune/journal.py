"""Optuna's journal file (``study.journal``) of a ``search.py --tune`` study or of a race, read
back whole or refused in one line.

Optuna's ``JournalFileBackend`` keeps a study as one JSON record a line, appended under its own
lock (a symlink ``study.journal.lock``). A command killed during an append leaves the last record
cut short, and the lock behind; Optuna 5.1's reader skips an unfinished last line, but the next
append runs on after it, and from then on every read of the study fails with a bare
``json.decoder.JSONDecodeError`` (the record cut short and the new one run together, or a blank
line, followed by more). So the command that holds the study's folder (its
:class:`autoln.core.locks.FolderLock`: no other process writes the journal) calls
:func:`ready_journal` before it opens the study:

- a stale journal lock goes at once (Optuna would wait 30 s to force it), with a note;
- a last record cut short is cut off, and blank lines (which hold no record) are dropped: the
  journal as it was is kept beside it (``study.journal.<UTC time>Z.bak``) and the repaired one
  put in its place atomically, with a note; what the cut record said is redone (a trial it
  finished is found running, marked failed and run again);
- any other damage (a record before the last that is not one JSON object: two records run
  together, a foreign line) is not guessed at: :class:`JournalDamaged`, which the command turns
  into one line naming the file, the line and the way on (:func:`damaged_message`).

A record that Optuna's own reader refuses while the study runs raises :class:`JournalDamaged`
too (:func:`autoln.tune.storage.journal_backend`).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Optional

#: Optuna's lock beside the journal (``JournalFileSymlinkLock``).
LOCK_SUFFIX = ".lock"
#: What :func:`record_problem` says of a blank line (which :func:`repair_journal` drops).
BLANK = "a blank line, which holds no record"
#: The start of every record Optuna writes (``json.dumps`` of ``{"op_code": ..., ...}``).
RECORD_START = b'{"op_code"'


class JournalDamaged(BaseException):
    """A record of the journal ``path`` that no reader can take: ``line`` (1-based, of ``lines``
    whole lines) and ``what`` is wrong with it. A ``BaseException``, as
    :class:`autoln.tune.storage.StorageGone` is: raised from inside Optuna's reads, it must pass
    through ``study.optimize`` untouched to the command, which words it
    (:func:`damaged_message`)."""

    def __init__(self, path: Path, line: int, lines: int, what: str) -> None:
        super().__init__(f"{path}, line {line} of {lines}: {what}")
        self.path, self.line, self.lines, self.what = Path(path), line, lines, what

    def __reduce__(self):  # a --workers process sends it back to the command
        return (JournalDamaged, (self.path, self.line, self.lines, self.what))


def record_problem(line: bytes) -> Optional[str]:
    """What keeps the journal line ``line`` (without its newline) from being one record: None for
    a JSON object, else the words (blank, not UTF-8, two records run together, a record cut short
    with another after it, not JSON)."""
    if not line.strip():
        return BLANK
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 text (byte {exc.start + 1})"
    decoder = json.JSONDecoder()
    try:
        value, end = decoder.raw_decode(text)
    except json.JSONDecodeError as exc:
        later = line.rfind(RECORD_START)
        if later > 0:
            try:
                json.loads(line[later:])
                return (f"a record cut short (its first {later} bytes) with a whole record run on after it, as a command "
                        "killed while appending leaves it once another appends")
            except ValueError:
                pass
        return f"not a JSON record ({exc.msg} at column {exc.colno})"
    if text[end:].strip():
        return f"two records run together (the second starts at column {end + 1})"
    if not isinstance(value, dict):
        return f"not a record (a JSON {type(value).__name__})"
    return None


def first_damage(data: bytes, blank_ok: bool = True) -> Optional[tuple[int, int, str]]:
    """The first whole line (ended by a newline) of the journal text ``data`` that is damaged
    (blank lines aside when ``blank_ok``, :func:`repair_journal` drops them): ``(line number from
    1, whole lines, what is wrong)``, or None."""
    whole = data.split(b"\n")[:-1]
    for number, line in enumerate(whole, start=1):
        problem = record_problem(line)
        if problem is not None and not (blank_ok and not line.strip()):
            return number, len(whole), problem
    return None


def remove_stale_lock(journal: Path) -> Optional[str]:
    """Remove Optuna's journal lock beside ``journal`` (a symlink, or a file) when one is there:
    the caller holds the study's folder, so it was left by a killed command. Returns the note
    line that says so, or None when there was none."""
    stale = Path(str(journal) + LOCK_SUFFIX)
    if not os.path.lexists(stale):
        return None
    stale.unlink()
    return f"removed {stale}, a journal lock left by a killed command (Optuna would wait 30 s for it)"


def repair_journal(journal: Path) -> Optional[str]:
    """Make ``journal`` whole for Optuna's reader (module docstring): cut off a last record cut
    short (a last line without its newline; one that is a whole record gets its newline) and drop
    blank lines, keeping the file as it was beside it. Returns the note line that says what was
    done, or None when the journal was whole (or is missing).

    Raises:
        JournalDamaged: a record before the last is damaged; the file is left as it was.
        OSError: the journal cannot be read, or the repaired one cannot be written (the
            original is then intact).
    """
    from autoln.core.io import write_bytes_atomic
    from autoln.engine.training import utc_stamp

    try:
        data = journal.read_bytes()
    except FileNotFoundError:
        return None
    damage = first_damage(data)
    if damage is not None:
        raise JournalDamaged(journal, *damage)
    *whole, tail = data.split(b"\n")
    blank = [i + 1 for i, line in enumerate(whole) if not line.strip()]
    said = []
    if tail and record_problem(tail) is None:
        whole.append(tail)
        said.append("its last record lacked its newline (added)")
    elif tail:
        said.append(f"its last record was cut short ({len(tail)} bytes, line {len(whole) + 1}: a command killed while "
                    "appending it), so it was cut off and what it recorded is redone")
    if blank:
        said.append(f"{len(blank)} blank line(s) (line {', '.join(map(str, blank[:5]))}{', ...' if len(blank) > 5 else ''}), "
                    "which hold no record and which Optuna's reader refuses, were dropped")
    if not said:
        return None
    backup = journal.with_name(f"{journal.name}.{utc_stamp()}.bak")
    write_bytes_atomic(backup, data)
    kept = b"".join(line + b"\n" for line in whole if line.strip())
    write_bytes_atomic(journal, kept)
    return f"repaired {journal}: {'; '.join(said)}; the journal as it was is kept in {backup}"


def ready_journal(journal: Path) -> list[str]:
    """Before a study opens ``journal`` (the caller holds its folder): :func:`remove_stale_lock`,
    then :func:`repair_journal`. Returns their lines (the caller prints each, after its prefix).

    Raises:
        JournalDamaged, OSError: as :func:`repair_journal`."""
    notes = []
    stale = remove_stale_lock(journal)
    if stale:
        notes.append(stale)
    repaired = repair_journal(journal)
    if repaired:
        notes.append(repaired)
    return notes


def damaged_message(damaged: JournalDamaged, kept: str, again: str) -> str:
    """The one line of a damaged journal: the file, the line and what is wrong, that Optuna cannot
    read the study past it, and the way on: for a blank line (met while the study ran), run
    ``again``, whose :func:`repair_journal` drops it; else move the journal aside and run
    ``again``, which starts the study anew and finds ``kept`` (what the study's folders keep,
    read back rather than redone)."""
    if damaged.what.startswith(BLANK):  # what the next command's repair_journal drops
        return (f"{damaged.path}, line {damaged.line} of {damaged.lines}: {damaged.what}, so the study cannot be read past it. "
                f"Run the command again: it drops the blank line (keeping the journal as it was beside it) and goes on: {again}")
    aside = damaged.path.with_name(damaged.path.name + ".damaged")
    return (f"{damaged.path}, line {damaged.line} of {damaged.lines}: {damaged.what}, so the study cannot be read past it "
            f"(the file was left as it is). To go on, move it aside and run the command again: the study starts anew, and "
            f"{kept}: mv {shlex.quote(str(damaged.path))} {shlex.quote(str(aside))} && {again}")
