"""Which signals stop a run (one table, read by :class:`autoln.engine.checkpoint.StopSignals`, the
workers' forwarding in :mod:`autoln.engine.workers` and torchrun's exit in :mod:`autoln.core.distributed`)."""

from __future__ import annotations

import signal

#: The signals that stop a run as SIGTERM does (:class:`autoln.engine.checkpoint.StopSignals`: the checkpoint of the
#: step, the resume command, exit ``128 + signum``; a second one: at once): every signal whose
#: default action ends the process and that can be caught: SIGINT (Ctrl-C), SIGTERM (``kill``,
#: schedulers), SIGHUP (a closed terminal or ssh session), SIGQUIT (Ctrl-\), SIGUSR1 and SIGUSR2
#: (schedulers' pre-emption warnings, e.g. Slurm's ``--signal``), SIGXCPU (a CPU-time limit,
#: ``ulimit -t``) and SIGALRM. Left alone: SIGPIPE and SIGXFSZ (Python ignores them: a write
#: fails instead, :func:`autoln.engine.checkpoint.space_errors_kept`), SIGPROF and SIGVTALRM (profilers' timers).
STOP_SIGNALS: tuple[int, ...] = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2",
                                                                   "SIGXCPU", "SIGALRM") if hasattr(signal, n))
