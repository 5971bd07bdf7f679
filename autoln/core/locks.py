"""One run folder, one process: an exclusive lock held for a command's whole life.

:class:`FolderLock` takes ``fcntl.flock`` on ``<folder>/.autoln.lock`` (``tune.lock`` for a
study of ``search.py --tune``) before anything in the folder is read or removed, and keeps it
until the command ends; the kernel releases it when the process dies (SIGKILL, a lost node), so
a killed run never leaves a stale lock and ``--resume`` proceeds. A second command on a held
folder is refused at once, whatever its options (``--overwrite``, ``--resume``), naming the
holder's host and process id, and changes nothing. :func:`build_lock` serialises the token
cache's build of one corpus: a second run waits for the first and then reads its cache.

A lock file removed while its command runs (by hand, a clean-up script) leaves the folder open
to a second command. Each checkpoint therefore checks every lock this process holds
(:func:`check_held`, :meth:`FolderLock.check`): a missing lock file is re-created and locked
again, with a warning; if another command holds the folder by then, the run stops with one
line (:class:`autoln.core.errors.StateLost`) instead of writing over that one's files. A run folder
removed under a run ends it with one line too, naming the folder and the command that starts
it again (:meth:`FolderLock.__exit__`), instead of the first failed write's traceback.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from autoln.core.errors import AutolnError, FolderInUse, OutputError, StateLost

LOCK_FILE = ".autoln.lock"
#: The locks this process holds now, oldest first (:func:`check_held`).
_HELD: list["FolderLock"] = []


def is_main_process() -> bool:
    """True unless this is a ``torchrun`` worker of rank above 0 (read from the environment, so
    it holds before ``torch.distributed`` starts): only rank 0 locks a run's folder."""
    return os.environ.get("RANK", "0") == "0"


class FolderLock:
    """An exclusive lock on the folder ``folder`` for as long as the ``with`` block (or until
    :meth:`release`). A folder that does not exist is created, and removed again at release if
    nothing but the lock was written in it (bad input leaves no folder behind).

    Args:
        folder: the run (or shared) folder.
        what: what holds it, for the refusal message (e.g. ``search``).
        enabled: False makes the lock a no-op (``torchrun`` ranks above 0: rank 0 holds it).
        name: the lock file's name in ``folder`` (``search.py --tune`` keeps its ``tune.lock``).
        refusal: the refusal message, if not the default one: a ``str.format`` template with
            the fields ``folder``, ``path`` (the lock file) and ``holder`` (who holds it).

    Raises:
        FolderInUse: ``folder`` is held by another process (the message names its host, process
            id and command, and says nothing was changed).
        OutputError: ``folder`` is a file, a symbolic link to nothing (or under one), or cannot
            be created.
    """

    def __init__(self, folder: str | Path, what: str = "run", enabled: Optional[bool] = None, name: str = LOCK_FILE,
                 refusal: Optional[str] = None) -> None:
        self.folder, self.what, self.name, self.refusal = Path(folder), what, name, refusal
        self.enabled = is_main_process() if enabled is None else enabled
        self.fh = None
        self.created = False

    @property
    def path(self) -> Path:
        """The lock file, ``folder/name``."""
        return self.folder / self.name

    def acquire(self) -> "FolderLock":
        """Take the lock (see the class). Returns self."""
        if not self.enabled:
            return self
        if self.folder.exists() and not self.folder.is_dir():
            raise OutputError(f"--out {self.folder} exists and is not a folder")
        from autoln.core.io import missing_link

        link = missing_link(self.folder)
        if link is not None:
            raise OutputError(f"--out {self.folder}: {link}; create that folder, or choose another --out")
        ancestor = self.folder.absolute()
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise OutputError(f"--out {self.folder}: {ancestor} is a file, not a folder")
        self.created = not self.folder.exists()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            fh = open(self.path, "a+")
        except OSError as exc:
            raise OutputError(f"--out {self.folder}: {exc.strerror or exc}") from None
        holder = self._lock_or_holder(fh)
        if holder is not None:
            if self.refusal is not None:
                raise FolderInUse(self.refusal.format(folder=self.folder, path=self.path, holder=holder)) from None
            raise FolderInUse(f"--out {self.folder} is in use by {holder}: a folder holds one run at a time, so this "
                              "command changed nothing; wait for that one to end (a killed one releases the folder), or "
                              "choose another --out") from None
        self._write_holder(fh)
        self.fh = fh
        _HELD.append(self)
        return self

    def _lock_or_holder(self, fh) -> Optional[str]:
        """Lock the open lock file ``fh``: None when this process holds it now; else (another
        holds it, or it is no longer the file at :attr:`path`, which its holder removes at
        release: a lock on it is no lock) ``fh`` is closed and the holder it names is returned."""
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fh.fileno()).st_ino == os.stat(self.path).st_ino:
                return None
        except (BlockingIOError, FileNotFoundError):
            pass
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        return holder

    def _write_holder(self, fh) -> None:
        """Write who holds the folder into the (locked) lock file ``fh``: the refusal names it."""
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"autoln {self.what} (process {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)[:200]})\n")
            fh.flush()
        except OSError as exc:  # a full disk: the error names the lock file, as every writer's does
            try:
                fh.close()  # flushes the same line again, and fails the same way
            except OSError:
                pass
            raise OSError(exc.errno, exc.strerror, str(self.path)) from None

    def check(self, kept: str = "") -> None:
        """Make sure this process still holds the folder, i.e. the file at :attr:`path` is the
        one it locked. A lock file removed meanwhile is re-created and locked again, with a
        warning on stderr (a command that took the folder in between, if any, has ended: a
        running one would hold the file). Nothing when the lock is not held.

        Args:
            kept: the end of the message when another command holds the folder now: what
                this run keeps and the command that goes on (e.g. a checkpoint's
                ``; the last checkpoint ... continue with: ...``).

        Raises:
            StateLost: the folder itself was removed (:func:`folder_removed_message`), or
                another process holds a lock file at :attr:`path` now (named from that file);
                this run must stop without writing anything more in the folder.
        """
        if self.fh is None:
            return
        try:
            if os.stat(self.path).st_ino == os.fstat(self.fh.fileno()).st_ino:
                return
        except FileNotFoundError:
            pass
        if not self.folder.is_dir():
            raise StateLost(folder_removed_message(self.folder, self.what, f"{self.path} went with it"))
        try:
            fh = open(self.path, "a+")
        except FileNotFoundError:  # the folder went just now
            raise StateLost(folder_removed_message(self.folder, self.what, f"{self.path} went with it")) from None
        holder = self._lock_or_holder(fh)
        if holder is not None:
            raise StateLost(f"{self.path}, the lock of {self.folder}, was removed while this {self.what} ran, and {holder} "
                            f"has taken the folder since; this run stopped so as not to write over that one's files{kept}") from None
        self._write_holder(fh)
        old, self.fh = self.fh, fh
        old.close()  # its flock was on the removed file: no one else can wait on that one
        print(f"warning: {self.path}, the lock of {self.folder}, was removed while this {self.what} ran: re-created and "
              "locked again (no other command holds the folder now); the run goes on", file=sys.stderr, flush=True)

    def release(self) -> None:
        """Let the folder go: the lock file is removed (a second command never waits on it, so
        no one can hold its old inode), and a folder this lock created is removed when nothing
        else was written in it."""
        if self.fh is None:
            return
        try:
            if self._still_mine():  # a re-created file of another command is that one's
                self.path.unlink(missing_ok=True)
            if self.created and not any(self.folder.iterdir()):
                self.folder.rmdir()
        except OSError:
            pass
        finally:
            self.fh.close()  # closing the descriptor releases the flock
            self.fh = None
            if self in _HELD:
                _HELD.remove(self)

    def _still_mine(self) -> bool:
        """The file at :attr:`path` is the one this lock holds."""
        try:
            return os.stat(self.path).st_ino == os.fstat(self.fh.fileno()).st_ino
        except OSError:
            return False

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, exc_type, exc, tb) -> None:
        """Release the lock. A failed write (an ``OSError``, or an exception it caused) while
        the folder no longer exists becomes one :class:`autoln.core.errors.StateLost` line naming
        the folder and the command that starts the run again."""
        removed = (self.fh is not None and isinstance(exc, Exception) and not isinstance(exc, AutolnError)
                   and not self.folder.is_dir())
        self.release()
        if removed:
            from autoln.core.io import os_error_in

            cause = os_error_in(exc)
            if cause is not None:
                name = os.fsdecode(cause.filename) if cause.filename else type(cause).__name__
                raise StateLost(folder_removed_message(self.folder, self.what, f"{name}: {cause.strerror or cause}")) from None


def folder_removed_message(folder: Path, what: str, cause: str) -> str:
    """The one line of a run whose folder ``folder`` was removed while it ran (``what``: e.g.
    ``search``; ``cause``: how it showed, e.g. the write that failed): nothing is left to
    resume, and the command that starts it again (this process's, without ``--resume``)."""
    from autoln.core.commands import rerun_line

    again = rerun_line(sys.argv[0], *(a for a in sys.argv[1:] if a != "--resume"))
    return (f"--out {folder}: the run folder was removed while this {what} ran ({cause}); its checkpoint went with it, "
            f"so nothing is left to resume: start it again with: {again}")


def check_held(kept: str = "") -> None:
    """:meth:`FolderLock.check` of every lock this process holds (at each checkpoint).

    Raises:
        StateLost: as :meth:`FolderLock.check`.
    """
    for lock in list(_HELD):
        lock.check(kept)


@contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive, blocking ``flock`` on ``path`` (e.g. a token cache entry's
    ``<key>.lock``) for the block: a second process building the same thing waits, then finds
    it built. An unwritable place is not locked (the caller's writes fail the same way)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+")
    except OSError:
        yield
        return
    try:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield
    finally:
        fh.close()
