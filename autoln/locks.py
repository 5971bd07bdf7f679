"""One run folder, one process: an exclusive lock held for a command's whole life.

:class:`FolderLock` takes ``fcntl.flock`` on ``<folder>/.autoln.lock`` (``tune.lock`` for a
study of ``search.py --tune``) before anything in the folder is read or removed, and keeps it
until the command ends; the kernel releases it when the process dies (SIGKILL, a lost node), so
a killed run never leaves a stale lock and ``--resume`` proceeds. A second command on a held
folder is refused at once, whatever its options (``--overwrite``, ``--resume``), naming the
holder's host and process id, and changes nothing. :func:`build_lock` serialises the token
cache's build of one corpus: a second run waits for the first and then reads its cache.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

from .errors import FolderInUse, OutputError

LOCK_FILE = ".autoln.lock"


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
        OutputError: ``folder`` is a file, or cannot be created.
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
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            # the holder removes the file at release: a lock on a file no longer at the path is no lock
            if os.fstat(fh.fileno()).st_ino != os.stat(self.path).st_ino:
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            if self.refusal is not None:
                raise FolderInUse(self.refusal.format(folder=self.folder, path=self.path, holder=holder)) from None
            raise FolderInUse(f"--out {self.folder} is in use by {holder}: a folder holds one run at a time, so this "
                              "command changed nothing; wait for that one to end (a killed one releases the folder), or "
                              "choose another --out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"autoln {self.what} (process {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)[:200]})\n")
        fh.flush()
        self.fh = fh
        return self

    def release(self) -> None:
        """Let the folder go: the lock file is removed (a second command never waits on it, so
        no one can hold its old inode), and a folder this lock created is removed when nothing
        else was written in it."""
        if self.fh is None:
            return
        try:
            self.path.unlink(missing_ok=True)
            if self.created and not any(self.folder.iterdir()):
                self.folder.rmdir()
        except OSError:
            pass
        finally:
            self.fh.close()  # closing the descriptor releases the flock
            self.fh = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


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
