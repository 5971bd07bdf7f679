"""Errors that autoln reports to users as one clear line instead of a traceback.

Every error raised on bad input derives from :class:`AutolnError`; the command-line
entry points (:mod:`autoln.cli`) catch it, print ``error: <message>`` and exit with
status 2. The message always names the file or field at fault and what was expected.
"""


class AutolnError(Exception):
    """Base class of all user-facing errors (bad config, data, genotype or output folder)."""


class ConfigError(AutolnError):
    """A config file or ``--set`` override is invalid; the message names the key."""


class DataError(AutolnError):
    """A corpus file or folder is missing, empty, too short or undecodable; names the file."""


class GenotypeError(AutolnError):
    """A genotype file or dict is malformed; the message names the field (e.g. ``placements[3]``)."""


class OutputError(AutolnError):
    """The output folder cannot be used (e.g. it holds a finished run and ``--overwrite`` is absent)."""


class WriteError(OutputError):
    """A file could not be written for want of space: a full disk (``ENOSPC``), a file-size
    limit (``EFBIG``, ``ulimit -f``) or a quota (``EDQUOT``). The message names the file and
    the cause, what is kept (the previous checkpoint: writes are atomic) and the command that
    continues once there is space (:func:`autoln.engine.checkpoint.space_errors_kept`)."""


class FolderInUse(OutputError):
    """The run folder is held by another process (:class:`autoln.core.locks.FolderLock`): nothing
    was changed, and the same command later, or on another folder, can go on."""


class StateLost(OutputError):
    """A file or folder that a running command keeps its state in was removed (or replaced)
    under it: the study's journal or SQLite database (``search.py --tune``,
    :mod:`autoln.tune`), the run folder, or the folder's lock file once another command has
    taken the folder (:meth:`autoln.core.locks.FolderLock.check`). The command stops at once; the
    message names the file, what was kept and the command that goes on (exit status 2)."""


class DivergenceError(AutolnError):
    """A training loss or gradient became NaN or inf under ``on_divergence: stop``; the message
    names the step and the last good checkpoint."""


#: Characters of a user's value that an error message quotes at most (:func:`quoted`, :func:`cut`):
#: enough for any value autoln expects, and a 10 MB value still gives a one-line error.
QUOTE_LIMIT = 240


def cut(text: str, limit: int = QUOTE_LIMIT) -> str:
    """``text`` itself when at most ``limit`` characters, else its first ``limit`` characters
    and how long it was: ``'aaaa...... (10,485,760 characters)'``. For names (a field, a key)
    that an error message shows unquoted."""
    text = str(text)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def quoted(value, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for an error message, bounded: the same as ``repr`` for a value of at
    most ``limit`` characters; a longer string is its first ``limit`` characters' repr and its
    length (``'xxxx'... (10,485,760 characters)``); a long list, tuple, set or mapping shows its
    first items (:mod:`reprlib`, without building the whole repr) and its length in items; any
    other value's repr is cut to ``limit`` characters. Every message that echoes a value read
    from a user's file (genotype, config, site genotype) goes through it, so no error line
    grows with the input."""
    import reprlib

    if isinstance(value, str):
        return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value):,} characters)"
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        short = reprlib.Repr()
        short.maxlevel, short.maxlist, short.maxtuple, short.maxset, short.maxfrozenset, short.maxdict = 3, 12, 12, 12, 12, 12
        short.maxstring, short.maxlong, short.maxother = 60, 60, 60
        if len(value) <= short.maxlist:
            text = repr(value)
            if len(text) <= limit:
                return text
        text = short.repr(value)
        return f"{text if len(text) <= limit else text[:limit] + '...'} ({len(value):,} items)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"
