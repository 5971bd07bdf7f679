"""Command lines that autoln prints for the user to run next (``next:`` hints, resume hints).

Every hint is a complete shell command, quoted with :func:`shlex.quote`, that names the
interpreter (or script) this run was started with, so that it works when copied as is.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

#: Options that run several jobs; re-running such a command resumes it (it has no ``--resume``).
MULTI_RUN_OPTIONS = ("--seeds", "--tune", "--compare")
#: The commands that take ``--resume`` (one run each). Any other command that runs searches or
#: retrains (the experiment scripts) has none: run again as it was, it reuses its finished runs
#: and continues the interrupted one from its checkpoint.
RESUME_COMMANDS = ("search.py", "retrain.py", "autoln-search", "autoln-retrain")


def beside_python(name: str, fallback: str) -> Path:
    """The script ``name`` beside this interpreter (a virtual environment's ``bin``), relative to
    the working directory when it lies under it, else ``fallback`` (found on ``PATH``)."""
    exe = Path(sys.executable) if name == "python" else Path(sys.executable).parent / name
    try:
        return exe.relative_to(Path.cwd()) if exe.exists() else Path(fallback)
    except ValueError:
        return Path(fallback)


def command_line(script: str, *args) -> str:
    """A shell command line ``<this python> script args...`` (``args``: strings or paths)."""
    return " ".join(shlex.quote(str(a)) for a in (beside_python("python", "python"), script, *args))


def tensorboard_line(logdir: Path) -> str:
    """The command line that opens TensorBoard on ``logdir``: the ``tensorboard`` script beside
    this interpreter (a virtual environment's), else the one on ``PATH``."""
    return " ".join(shlex.quote(str(a)) for a in (beside_python("tensorboard", "tensorboard"), "--logdir", logdir))


def pip_extra(extra: str) -> str:
    """The command that installs autoln's optional ``extra`` (``hf``, ``postgres``) into this
    interpreter's environment from the clone, as the README installs autoln:
    ``.venv/bin/pip install -e ".[hf]"``."""
    return f"{beside_python('pip', 'pip')} install -e \".[{extra}]\""


def resume_command(out: Path) -> str:
    """The command that continues the interrupted run in ``out``: this process's own command
    line (``sys.argv``) without ``--overwrite``, with ``--resume`` and ``--out out`` added when
    missing. A command of several jobs (``--seeds``, ``--tune``, ``--compare``) and any command
    other than :data:`RESUME_COMMANDS` (e.g. ``experiments/validate.py``) resumes by being run
    again as it was, without ``--overwrite``."""
    script = sys.argv[0]
    args = [a for a in sys.argv[1:] if a != "--overwrite"]  # run again with it, it would redo the finished runs
    if Path(script).name not in RESUME_COMMANDS or any(a == o or a.startswith(o + "=") for a in args for o in MULTI_RUN_OPTIONS):
        return command_line(script, *args)
    if "--resume" not in args:
        args.append("--resume")
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(out)]
    return command_line(script, *args)
