"""Atomic file output: a reader sees the old file or the complete new one, never half of one.

Each writer writes a temporary file in the destination folder, flushes it to disk, then
``os.replace``s it over the destination (atomic on POSIX and Windows for one filesystem).
"""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import torch


_UMASK = os.umask(0o022)
os.umask(_UMASK)


#: The errors of a write that more space, or a higher file-size limit, would let through:
#: no space left (``ENOSPC``), a file over the ``ulimit -f`` limit (``EFBIG``), a disk quota
#: reached (``EDQUOT``).
SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)})


def os_error_in(exc: BaseException) -> Optional[OSError]:
    """The :class:`OSError` that ``exc`` is, or that caused it (``__cause__`` or ``__context__``,
    followed to the root), or None. Libraries report a failed write in their own exception:
    ``torch.save`` raises ``RuntimeError: [enforce fail at inline_container.cc] ... unexpected
    pos`` with the ``OSError`` (e.g. ``Errno 28``) as its context."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def write_failure(exc: BaseException, path: str | Path, written: Optional[int] = None) -> Optional[OSError]:
    """The failure of writing ``path`` as an ``OSError(errno, strerror, path)``: the errno of the
    ``OSError`` in ``exc`` (:func:`os_error_in`), or, when it has none (NumPy's short write,
    ``"10000 requested and 484 written"``), ``EFBIG`` when ``written`` bytes reach the
    process's file-size limit (``RLIMIT_FSIZE``) and ``ENOSPC`` when the folder's file system
    has no block left. None when no ``OSError`` is involved (the exception is then not a
    write failure and is left as it is)."""
    cause = os_error_in(exc)
    if cause is None:
        return None
    code = cause.errno
    if code is None:
        code = _short_write_errno(Path(path), written)
    if code is None:
        return OSError(errno.EIO, str(cause) or type(cause).__name__, str(path))
    return OSError(code, os.strerror(code), str(path))


def _short_write_errno(path: Path, written: Optional[int]) -> Optional[int]:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if written is not None and soft != resource.RLIM_INFINITY and written >= soft:
            return errno.EFBIG
    except (ImportError, OSError, ValueError):  # no resource module (Windows)
        pass
    try:
        st = os.statvfs(path.parent)
        return errno.ENOSPC if st.f_bavail == 0 else None
    except (OSError, AttributeError):
        return None


def is_space_error(exc: BaseException) -> bool:
    """True when ``exc`` is a write that failed for want of space or of file-size limit
    (:data:`SPACE_ERRNOS`)."""
    cause = os_error_in(exc)
    return cause is not None and cause.errno in SPACE_ERRNOS


def _atomic(path: str | Path, write: Callable[[Any], None], mode: str) -> Path:
    """Write ``path`` through ``write(fh)`` on a temporary file beside it, then replace.

    Raises:
        OSError: the folder cannot be written, or the write failed (full disk, file-size
            limit, ...), whatever the library's exception was, with ``filename`` the
            destination (:func:`write_failure`); the temporary file is removed and the old
            file, if any, left whole."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give outputs the usual mode
        with os.fdopen(fd, mode) as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except Exception as exc:
        failure = write_failure(exc, path, _size(tmp))
        Path(tmp).unlink(missing_ok=True)
        if failure is None:
            raise
        raise failure from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _size(path: str) -> Optional[int]:
    try:
        return os.path.getsize(path)
    except OSError:
        return None


def remove_stale_temps(path: str | Path) -> int:
    """Delete the temporary files an atomic write of ``path`` leaves when its process is killed
    mid-write (``.<name>.*.tmp`` beside it); returns how many were removed."""
    path = Path(path)
    removed = 0
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; creates parent folders. Returns the path.

    Raises:
        OSError: the folder is not writable (the old file, if any, is left intact).
    """
    return _atomic(path, lambda fh: fh.write(text.encode("utf-8")), "wb")


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; creates parent folders. Returns the path.

    Raises:
        OSError: as :func:`write_text_atomic`.
    """
    return _atomic(path, lambda fh: fh.write(data), "wb")


def missing_link(path: str | Path) -> Optional[str]:
    """When ``path`` or one of its ancestors is a symbolic link to nothing (its target missing),
    the words that say so: ``<link> is a symbolic link to <target>, which does not exist``;
    else None. ``mkdir`` on such a path fails with a bare ``File exists`` that names neither."""
    p = Path(path)
    for q in (p, *p.parents):
        if q.is_symlink() and not q.exists():
            target = Path(os.readlink(q))
            shown = target if target.is_absolute() else Path(os.path.normpath(q.parent / target))
            return f"{q} is a symbolic link to {shown}, which does not exist"
    return None


def json_safe(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float replaced by None (recursively)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def write_json_atomic(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented, strict JSON atomically; NaN and inf (e.g. the alpha Hessian's
    eigenvalue of a search that skipped diverged batches) become ``null``, as strict JSON has
    neither. Returns the path.

    Raises:
        OSError: as :func:`write_text_atomic`.
    """
    return write_text_atomic(path, json.dumps(json_safe(obj), indent=2, allow_nan=False) + "\n")


def save_torch_atomic(obj: Any, path: str | Path) -> Path:
    """``torch.save(obj)`` to ``path`` atomically (checkpoints). Returns the path."""
    return _atomic(path, lambda fh: torch.save(obj, fh), "wb")


def save_numpy_atomic(arr: Any, path: str | Path) -> Path:
    """``np.save(arr)`` to ``path`` (``.npy``) atomically and flushed to disk, as every file the
    project reads back (the token cache). Returns the path."""
    import numpy as np

    return _atomic(path, lambda fh: np.save(fh, arr), "wb")


def copy_atomic(src: str | Path, dst: str | Path) -> Path:
    """Copy the file ``src`` to ``dst`` atomically (a reader of ``dst`` never sees half a copy).

    Raises:
        OSError: ``src`` unreadable or ``dst``'s folder not writable.
    """
    import shutil

    with open(src, "rb") as source:
        return _atomic(dst, lambda fh: shutil.copyfileobj(source, fh), "wb")


class DuplicateKey(ValueError):
    """A JSON object holding one key twice (a hand edit pasted a second copy above the first):
    refused, since the last one would silently win (RFC 8259 §4 leaves it undefined)."""


def loads_strict(text: str) -> Any:
    """``json.loads(text)``, refusing an object with one key twice.

    Raises:
        DuplicateKey: names the key; ValueError: invalid JSON (as ``json.loads``)."""
    def pairs(items: list) -> dict:
        out: dict = {}
        for key, value in items:
            if key in out:
                raise DuplicateKey(f"the key {key!r} appears twice in one object: keep one")
            out[key] = value
        return out
    return json.loads(text, object_pairs_hook=pairs)


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``, or None when the file is missing, unreadable, not UTF-8 or
    not valid JSON (e.g. cut short by a crash or a full disk): for files a run reuses when
    present and redoes otherwise.

    Raises:
        OutputError: an object holds one key twice (a hand edit; :func:`loads_strict`): the
            file is refused, not redone, naming it and the key."""
    from autoln.core.errors import OutputError

    try:
        return loads_strict(Path(path).read_text(encoding="utf-8"))
    except DuplicateKey as exc:
        raise OutputError(f"{path}: {exc}") from None
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def save_figure_atomic(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG to ``path`` atomically. Returns the path."""
    return _atomic(path, lambda fh: fig.savefig(fh, format="png", dpi=dpi, bbox_inches="tight"), "wb")


def append_csv_row(path: str | Path, fields: list[str], row: dict) -> Path:
    """Append ``row`` (keys ``fields``) to the CSV table ``path``, its header first when the file
    is new, flushed and synced to disk: the experiments' tables of measured runs, where a row
    stands for hours of work and a crash must not lose the rows before it. Returns the path.

    Raises:
        OSError: the file cannot be written (a full disk names it, :func:`write_failure`)."""
    import csv

    path = Path(path)
    new = not path.exists()
    with open(path, "a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        if new:
            writer.writeheader()
        writer.writerow(row)
        f.flush()
        os.fsync(f.fileno())
    return path

