"""Command lines that autoln prints for the user to run next (``next:`` hints, resume hints).

Every hint is a complete shell command, quoted with :func:`shlex.quote`, that names the
interpreter (or script) this run was started with, so that it works when copied as is.
"""

from __future__ import annotations

import os
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
    the working directory when it lies under it, else its absolute path (a bare ``python`` or
    ``pip`` would be the first on ``PATH``, maybe another environment's, without autoln); only
    when there is no such file, ``fallback`` (found on ``PATH``)."""
    exe = Path(sys.executable) if name == "python" else Path(sys.executable).parent / name
    if not exe.exists():
        return Path(fallback)
    try:
        return exe.relative_to(Path.cwd())
    except ValueError:
        return exe


def command_line(script: str, *args) -> str:
    """A shell command line ``<this python> script args...`` (``args``: strings or paths)."""
    return " ".join(shlex.quote(str(a)) for a in (beside_python("python", "python"), script, *args))


#: The folder of the clone autoln runs from (an editable install): ``search.py``, ``retrain.py``
#: and ``pyproject.toml`` lie there.
CLONE = Path(__file__).resolve().parents[2]


def _here(path: Path) -> Path:
    """``path`` relative to the working directory when it lies under it, else absolute."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path.resolve()


def script_path(name: str) -> Path:
    """Where the command ``name`` (``search.py`` or ``retrain.py``) is, for a ``next:`` line that
    works from the working directory: beside this process's own script when it was started as
    one of :data:`RESUME_COMMANDS` (``python /path/search.py`` gives ``/path/retrain.py``,
    ``.venv/bin/autoln-search`` gives ``.venv/bin/autoln-retrain``), else the clone's (:data:`CLONE`),
    else the ``autoln-*`` entry point beside this interpreter; relative to the working directory
    when under it."""
    entry = "autoln-" + name.removesuffix(".py")
    started = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if started is not None and started.name in RESUME_COMMANDS:
        sibling = started.parent / (name if started.name.endswith(".py") else entry)
        if sibling.is_file():
            return sibling if not sibling.is_absolute() else _here(sibling)
    if (CLONE / name).is_file():
        return _here(CLONE / name)
    return beside_python(entry, entry)


def script_line(name: str, *args) -> str:
    """The shell command line ``<this python> <name's path> args...`` of a ``next:`` line:
    :func:`command_line` with the script found by :func:`script_path`, so that it runs as
    printed from the working directory whatever folder the first command was started from."""
    return command_line(str(script_path(name)), *args)


def _parent_argv() -> list[str]:
    """The command line of this process's parent (for a process that ``torchrun`` started,
    torchrun's), from ``/proc``; ``[]`` where it cannot be read."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return []
    return [os.fsdecode(a) for a in raw.split(b"\0")[:-1]]


def launcher(parent: "list[str] | None" = None) -> list[str]:
    """What comes before the script in the command that started this process: this interpreter
    (:func:`beside_python`); under ``torchrun`` (which sets ``TORCHELASTIC_RUN_ID``) the torchrun
    command the user ran, from its command line ``parent`` (default :func:`_parent_argv`; the
    script and its arguments are this process's ``sys.argv``), e.g. ``.venv/bin/torchrun
    --standalone --nproc_per_node 2`` or ``python -m torch.distributed.run ...``; where that
    cannot be read, ``torchrun`` with the sizes torchrun set (``GROUP_WORLD_SIZE`` machines of
    ``LOCAL_WORLD_SIZE`` processes). On several machines it is this machine's command (its
    ``--node_rank``); each machine runs its own."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return [str(beside_python("python", "python"))]
    parent = _parent_argv() if parent is None else parent
    n = len(sys.argv)
    if len(parent) > n and parent[-n:] == sys.argv:
        words = parent[:-n]
        if len(words) > 1 and Path(words[1]).name.startswith("torchrun"):  # a script run by its #! interpreter
            words = words[1:]
        try:
            words[0] = str(Path(words[0]).relative_to(Path.cwd())) if Path(words[0]).is_absolute() else words[0]
        except ValueError:
            pass
        return words
    nodes = os.environ.get("GROUP_WORLD_SIZE", "1")
    return [str(beside_python("torchrun", "torchrun")), *(["--standalone"] if nodes == "1" else ["--nnodes", nodes]),
            "--nproc_per_node", os.environ.get("LOCAL_WORLD_SIZE", "1")]


def rerun_line(script: str, *args) -> str:
    """The shell command line that runs ``script args...`` as this process was started: like
    :func:`command_line`, but under ``torchrun`` with the same torchrun command (:func:`launcher`)."""
    return " ".join(shlex.quote(str(a)) for a in (*launcher(), script, *args))


def tensorboard_line(logdir: Path) -> str:
    """The command line that opens TensorBoard on ``logdir``: the ``tensorboard`` script beside
    this interpreter (a virtual environment's), else the one on ``PATH``."""
    return " ".join(shlex.quote(str(a)) for a in (beside_python("tensorboard", "tensorboard"), "--logdir", logdir))


def pip_extra(extra: str) -> str:
    """The command that installs autoln's optional ``extra`` (``hf``, ``postgres``) into this
    interpreter's environment from the clone, as the README installs autoln:
    ``.venv/bin/pip install -e ".[hf]"`` in the clone's folder; from any other folder the
    clone's path instead of ``.`` (``/home/me/autoln/.venv/bin/pip install -e '/home/me/autoln[hf]'``),
    so it runs as printed wherever the run was started."""
    pip = beside_python("pip", "pip")
    if not (CLONE / "pyproject.toml").is_file() or Path.cwd().resolve() == CLONE:
        return f"{pip} install -e \".[{extra}]\""
    return f"{shlex.quote(str(pip))} install -e {shlex.quote(f'{CLONE}[{extra}]')}"


def again_command() -> str:
    """The command that goes on after this process stopped outside a run's steps (Ctrl-C between
    the runs of ``--seeds``/``--tune``/``--compare``, a dead ``--workers`` process, memory short
    in one of them): this process's own command line, as :func:`rerun_line` writes it, without
    ``--overwrite`` when it runs several jobs or is not one of :data:`RESUME_COMMANDS` (run again
    with it, it would redo the finished runs that it says are kept)."""
    script, args = sys.argv[0], list(sys.argv[1:])
    if Path(script).name not in RESUME_COMMANDS or any(a == o or a.startswith(o + "=") for a in args for o in MULTI_RUN_OPTIONS):
        args = [a for a in args if a != "--overwrite"]
    return rerun_line(script, *args)


def resume_command(out: Path) -> str:
    """The command that continues the interrupted run in ``out``: this process's own command
    line (``sys.argv``) without ``--overwrite``, with ``--resume`` and ``--out out`` added when
    missing. A command of several jobs (``--seeds``, ``--tune``, ``--compare``) and any command
    other than :data:`RESUME_COMMANDS` (e.g. ``experiments/common/validate.py``) resumes by being run
    again as it was, without ``--overwrite``. Under ``torchrun`` the command is the same
    torchrun command (:func:`rerun_line`)."""
    script = sys.argv[0]
    args = [a for a in sys.argv[1:] if a != "--overwrite"]  # run again with it, it would redo the finished runs
    if Path(script).name not in RESUME_COMMANDS or any(a == o or a.startswith(o + "=") for a in args for o in MULTI_RUN_OPTIONS):
        return rerun_line(script, *args)
    if "--resume" not in args:
        args.append("--resume")
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(out)]
    return rerun_line(script, *args)
