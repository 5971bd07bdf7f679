"""The run folder ``out`` of :func:`autoln.search`: refused when it cannot be one
(:func:`check_folder`), its finished or interrupted search found, and the checkpoint to resume
from checked against the settings (:func:`check_resumable`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import torch

from autoln.core.errors import OutputError


#: The file :func:`search` writes its answer to in ``out``.
GENOTYPE_FILE = "genotype.json"


#: The settings of :func:`search` that only say how fast it runs (:data:`autoln.config.PLACE_KEYS`
#: without their section): they may change on ``resume``. The model's own device is the user's.
API_PLACE_KEYS = ("device", "compile", "precision")


def check_resumable(out: Path, resume: bool, overwrite: bool, header: dict) -> Optional[dict]:
    """For :func:`search` with ``out``: the checkpoint to continue from (``resume``), or None.

    Raises:
        OutputError: ``out`` holds a finished search (without ``overwrite``), or an interrupted
            one without ``resume`` or ``overwrite``; the checkpoint is unreadable or not this
            kind's.
        ConfigError: with ``resume``, settings that differ from the checkpoint's (named).
    """
    from autoln.engine.checkpoint import NOT_BITWISE, resume_differences, thread_change
    from autoln.core.errors import ConfigError
    from autoln.engine.training import CHECKPOINT_FILE, check_out_dir

    if not resume:
        if (out / GENOTYPE_FILE).exists() and not overwrite:
            raise OutputError(f"out={str(out)!r} holds a finished search ({GENOTYPE_FILE}): choose another folder, "
                              "or pass overwrite=True")
        if (out / CHECKPOINT_FILE).exists() and not overwrite:
            raise OutputError(f"out={str(out)!r} holds an interrupted search ({CHECKPOINT_FILE}): pass resume=True to "
                              "continue it, or overwrite=True to start again")
        check_out_dir(out, True)
        return None
    if (out / GENOTYPE_FILE).exists():
        raise OutputError(f"resume: {out} holds a finished search ({GENOTYPE_FILE}); nothing to resume")
    path = out / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: one line
        raise OutputError(f"resume: {path} is not a readable autoln checkpoint ({type(exc).__name__})") from None
    if not isinstance(ckpt, dict) or ckpt.get("kind") != header["kind"]:
        raise OutputError(f"resume: {path} is not a checkpoint of autoln.search")
    diffs, place = resume_differences(ckpt["config"], header["config"], place_keys=API_PLACE_KEYS)
    if diffs:
        raise ConfigError(f"resume: the settings differ from the checkpoint's in {len(diffs)} key(s): " + "; ".join(diffs))
    place += thread_change(ckpt)
    if place:
        print(f"note: resume with {'; '.join(place)}: {NOT_BITWISE}", file=sys.stderr)
    return ckpt


def resume_hint(out: Path) -> str:
    """How an interrupted :func:`search` in ``out`` continues, for its stop messages."""
    return f"the same autoln.search(...) call with out={str(out)!r}, resume=True"


def check_folder(out: Path, resume: bool) -> None:
    """Refuse an ``out`` of :func:`search` that cannot be a run folder, in the API's words.

    Raises:
        OutputError: ``out`` or an ancestor is a file; with ``resume``, ``out`` does not exist."""
    if out.exists() and not out.is_dir():
        raise OutputError(f"autoln.search: out={str(out)!r} exists and is not a folder")
    ancestor = out.absolute()
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"autoln.search: out={str(out)!r}: {ancestor} is a file, not a folder")
    if resume and not out.is_dir():
        raise OutputError(f"autoln.search: resume=True: out={str(out)!r} does not exist, so there is no run to continue")
