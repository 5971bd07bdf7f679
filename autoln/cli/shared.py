"""What ``search.py`` and ``retrain.py`` share around a run: its folder under ``torchrun``, the
refusal of ``torchrun`` by commands of several jobs, the busy-machine line and the warning on
skipped updates."""

from __future__ import annotations

import sys


def _shared_out(out, device_name: str):
    """The run folder, rank 0's under ``torchrun`` (a default folder is named by the time,
    which may differ between processes); joins the process group first."""
    from autoln.core import distributed
    from autoln.engine.training import resolve_device

    if distributed.launched():
        distributed.init(resolve_device(device_name))
    return distributed.from_main(out)


def _skipped_note(skipped: int, steps: int, what: str = "updates") -> None:
    """Warn when ``on_divergence: skip_batch`` skipped updates (:func:`autoln.oneshot.search_loop.skipped_line`)."""
    from autoln.oneshot.search_loop import skipped_line

    line = skipped_line(skipped, steps, what)
    if line:
        print(f"warning: {line}", file=sys.stderr)


def _refuse_torchrun(option: str) -> None:
    from autoln.core import distributed
    from autoln.core.errors import ConfigError

    if distributed.launched():
        raise ConfigError(f"{option} runs several jobs and cannot run under torchrun; start it with plain python"
                          + (" (use --workers N for parallel trials)" if option == "--tune" else ""))


def _say_if_busy() -> None:
    """On the main process, one line on stderr when the load is above the cores
    (:func:`autoln.models.resources.busy_line`)."""
    from autoln.core import distributed
    from autoln.models.resources import busy_line

    line = busy_line() if distributed.is_main() else None
    if line:
        print(line, file=sys.stderr, flush=True)
