"""Exit statuses and one-line errors of ``search.py`` and ``retrain.py`` (:func:`guarded`).

Exit status: 0 on success, 2 for bad input (config, data, genotype, output folder, or a file
the system refuses; one line ``error: ...`` naming the file or field, no traceback), 3 when
training diverged (``on_divergence: stop``), 4 out of memory, 5 when a ``--workers`` process
(or another ``torchrun`` process) died, 130 on Ctrl-C (SIGINT) and 143 on SIGTERM, after the run's checkpoint is written;
``--resume`` continues from it.

Data-parallel: ``torchrun --nproc_per_node N search.py ...`` (or ``retrain.py``) trains one
model across N processes (:mod:`autoln.core.distributed`); only rank 0 prints and writes. Each
process exits with the status above; torchrun itself exits 1 on any failure (docs/scale.md).
``--tune``, ``--seeds`` and ``--compare`` run several jobs and take ``--workers N`` (processes
on this machine) instead; ``--tune`` and ``--compare`` refuse ``torchrun``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Optional

from autoln.core.errors import AutolnError, DivergenceError

EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_OUT_OF_MEMORY = 4
EXIT_WORKER_DIED = 5


def guarded(body: Callable[[], None], resume: Optional[Callable[[], Optional[str]]] = None,
            folder: Optional[Callable[[], Optional[Path]]] = None) -> int:
    """Run ``body`` and turn autoln's errors, refused files and Ctrl-C into one line and an
    exit status; under ``torchrun`` rank 0 prints the line, every process exits with the status
    and leaves the process group at the end (:func:`autoln.core.distributed.finish`). ``resume()``:
    the command that continues the run once memory is free (the out-of-memory line's), None
    while the run folder is not known yet; default (and None) :func:`autoln.core.commands.again_command`.
    ``folder``: the run folder (None while not known), whose checkpoints (there or in a run below
    it) decide whether the out-of-memory line says one is kept."""
    said: list[str] = []
    try:
        code = _guarded(body, _on_main(said), resume, folder)
    except BaseException as exc:  # a bug: its traceback goes to torchrun's summary too
        distributed = sys.modules.get("autoln.core.distributed")
        if distributed is not None:
            distributed.finish(1, said, exc) if isinstance(exc, Exception) else distributed.shutdown()
        raise
    distributed = sys.modules.get("autoln.core.distributed")  # None: Ctrl-C came while torch imported
    return code if distributed is None else distributed.finish(code, said)


def _guarded(body: Callable[[], None], say: Callable[..., None], resume: Optional[Callable[[], Optional[str]]] = None,
             folder: Optional[Callable[[], Optional[Path]]] = None) -> int:
    """:func:`guarded`'s exit status for ``body``, its lines given to ``say``."""
    try:
        from autoln.core import distributed  # noqa: F401 - imported inside the try: Ctrl-C may come while torch imports

        try:
            body()
        except DivergenceError as exc:
            say(f"error: {exc}", file=sys.stderr)
            return EXIT_DIVERGED
    except AutolnError as exc:
        say(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (MemoryError, RuntimeError) as exc:  # RuntimeError: torch's allocators (CPU and CUDA)
        from concurrent.futures.process import BrokenProcessPool

        from autoln.core.io import os_error_in
        from autoln.models.resources import is_out_of_memory

        from autoln.core.commands import again_command

        if isinstance(exc, BrokenProcessPool):
            say("error: a --workers process died (killed by a signal, or by the system's out-of-memory killer); finished "
                f"runs and checkpoints on disk are kept: run the command again to go on: {again_command()} (with fewer "
                "--workers if memory was short)", file=sys.stderr)
            return EXIT_WORKER_DIED
        if "autoln.core.distributed" in sys.modules and sys.modules["autoln.core.distributed"].peer_lost(exc):  # another torchrun process ended
            say(f"error: another process of this torchrun job ended while this one waited for it ({sys.modules['autoln.core.distributed'].peer_lost_cause(exc)}); "
                "its own error line, or torchrun's summary of failures, says why; checkpoints already written are kept",
                file=sys.stderr)
            return EXIT_WORKER_DIED
        if os_error_in(exc) is not None and not is_out_of_memory(exc):  # a library's report of a refused write
            say(f"error: {os_error_line(os_error_in(exc))}", file=sys.stderr)
            return EXIT_BAD_INPUT
        if not is_out_of_memory(exc):
            raise
        go_on = (resume() if resume else None) or again_command()
        where = folder() if folder else None
        kept = ("The run folder keeps its last checkpoint" if where is not None and next(Path(where).rglob("checkpoint.pt"), None)
                else "No checkpoint was written before it (it starts again from step 0)")
        kept += f"; once memory is free, continue with: {go_on}"
        say(f"error: out of memory: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}. {kept}; or lower "
            "model.context, the batch_size or the model's size (model.d_model, model.n_layers, model.d_ff) and start a new "
            "run (--overwrite replaces this one, or choose another --out)", file=sys.stderr)
        return EXIT_OUT_OF_MEMORY
    except OSError as exc:  # a file the system refuses (permissions, full disk, ...)
        say(f"error: {os_error_line(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        # a bare KeyboardInterrupt came outside a run's steps (imports, config, between the runs of
        # --seeds/--tune/--compare): nothing half-done is kept, finished runs and checkpoints are
        from autoln.core.commands import again_command

        say(f"interrupted: {exc}" if str(exc) else "interrupted before a run started, or between runs: finished runs and "
            f"checkpoints on disk are kept; run the command again to go on: {again_command()}", file=sys.stderr)
        return 128 + getattr(exc, "signum", 2)
    return 0


def os_error_line(exc: OSError) -> str:
    """The line for a file the system refuses: its name and the cause; for a want of space
    (:data:`autoln.core.io.SPACE_ERRNOS`; inside a run, :func:`autoln.engine.checkpoint.space_errors_kept`
    has said it already) what is kept and the command to run again once there is space."""
    from autoln.engine.checkpoint import space_message
    from autoln.core.commands import rerun_line
    from autoln.core.io import SPACE_ERRNOS

    if exc.errno in SPACE_ERRNOS:
        again = rerun_line(sys.argv[0], *(a for a in sys.argv[1:] if a != "--overwrite"))
        return space_message(exc, None, again)
    from autoln.core.errors import cut

    return f"{cut(str(exc.filename or ''))}: {exc.strerror or exc}"  # a path can be 128 KiB long


def _on_main(said: list) -> Callable[..., None]:
    """``print`` that appends each message to ``said`` and prints it on rank 0 only: under
    ``torchrun`` every process raises the same error for the same input, before the process
    group exists or after, so one copy is enough (the rank from ``RANK``, as
    :func:`autoln.core.distributed.is_main`; another rank prints its own only when it failed alone,
    :func:`autoln.core.distributed.finish`)."""
    import os

    main = int(os.environ.get("WORLD_SIZE", "1")) <= 1 or int(os.environ.get("RANK", "0")) == 0

    def say(*args, **kwargs) -> None:
        said.append(kwargs.get("sep", " ").join(str(a) for a in args))
        if main:
            print(*args, **kwargs)
    return say
