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


class FolderInUse(OutputError):
    """The run folder is held by another process (:class:`autoln.locks.FolderLock`): nothing
    was changed, and the same command later, or on another folder, can go on."""


class DivergenceError(AutolnError):
    """A training loss or gradient became NaN or inf under ``on_divergence: stop``; the message
    names the step and the last good checkpoint."""
