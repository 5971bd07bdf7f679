"""Atomic file output: a reader sees the old file or the complete new one, never half of one.

Each writer writes a temporary file in the destination folder, flushes it to disk, then
``os.replace``s it over the destination (atomic on POSIX and Windows for one filesystem).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch


_UMASK = os.umask(0o022)
os.umask(_UMASK)


def _atomic(path: str | Path, write: Callable[[Any], None], mode: str) -> Path:
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
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


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


def read_json(path: str | Path) -> Any:
    """The JSON value in ``path``, or None when the file is missing, unreadable, not UTF-8 or
    not valid JSON (e.g. cut short by a crash or a full disk): for files a run reuses when
    present and redoes otherwise."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def save_figure_atomic(fig: Any, path: str | Path, dpi: int = 120) -> Path:
    """Save a matplotlib figure as PNG to ``path`` atomically. Returns the path."""
    return _atomic(path, lambda fh: fig.savefig(fh, format="png", dpi=dpi, bbox_inches="tight"), "wb")
