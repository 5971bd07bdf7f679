"""Checkpoints and exact resume (docs/design.md §1).

A run's ``checkpoint.pt`` holds everything the next step depends on: the model (weights and,
for a search, the alphas), the optimizers and learning-rate schedulers, the step, the random
states (Python, NumPy, torch CPU and CUDA, the data samplers), the run's own bookkeeping
(histories, counters) and the resolved config. It is written atomically (a temporary file,
then ``os.replace``) every ``checkpoint.every`` steps, at each evaluation, and when the run is
stopped by SIGINT or SIGTERM (:class:`StopSignals`). ``--resume`` rebuilds the run from it
(:func:`load_for_resume`): on CPU, a run killed at any step and resumed ends bitwise equal to
an uninterrupted one (``tests/test_resume.py``).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

from autoln.core import distributed
from autoln.core.signals import STOP_SIGNALS
from autoln.config import PLACE_KEYS, Config, with_defaults
from autoln.core.errors import ConfigError, OutputError, cut
from autoln.core.commands import again_command, resume_command
from autoln.core.io import remove_stale_temps, save_torch_atomic
from autoln.core.locks import LOCK_FILE
from autoln.core.errors import DivergenceError
from autoln.engine.training import CHECKPOINT_FILE

#: Config sections that may differ on ``--resume`` (they do not change what is computed).
RESUME_FREE = ("logging", "checkpoint")
#: The sections that define what each kind of run computes: a search does not read ``retrain``
#: or ``tune``, a retrain does not read ``search`` or ``tune``, so those may differ on ``--resume``.
RESULT_SECTIONS = {"search": ("data", "model", "search"), "retrain": ("data", "model", "retrain")}
#: The end of the note printed when a key of :data:`autoln.config.PLACE_KEYS` changes on resume.
NOT_BITWISE = "the run goes on from its checkpoint, but is no longer bitwise equal to an uninterrupted run"
#: The end of a stop message when no checkpoint exists yet.
NOTHING_TO_RESUME = "so there is nothing to resume: run the command again"
#: How a new run goes in the folder of a diverged one, whose checkpoint would refuse it (a
#: resume with the new settings is refused too): for the divergence messages.
NEW_RUN = "--overwrite replaces this one, or choose another --out"


def rng_state() -> dict[str, Any]:
    """The global random states: Python's, NumPy's legacy generator, torch's CPU and CUDA ones,
    as tensors and plain values (loadable with ``torch.load(weights_only=True)``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(), "numpy": [kind, torch.from_numpy(keys.copy()), pos, has_gauss, gauss],
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(path: Path, state: dict[str, Any]) -> Path:
    """Write ``state`` plus the random states to ``path`` atomically."""
    return save_torch_atomic({**state, "rng": rng_state()}, path)


def config_differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """``key (checkpoint X, now Y)`` for each dotted key whose value differs between two config
    dicts; the sections of :data:`RESUME_FREE` are ignored."""
    keys = sorted(set(saved) | set(current))
    out = []
    for key in keys:
        name = f"{prefix}{key}"
        if not prefix and key in RESUME_FREE:
            continue
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += config_differences(a, b, name + ".")
        elif a != b:
            out.append(f"{name} (checkpoint {a!r}, now {b!r})")
    return out


def resume_differences(saved: dict, current: dict, kind: Optional[str] = None,
                       place_keys: tuple[str, ...] = PLACE_KEYS) -> tuple[list[str], list[str]]:
    """How a checkpoint's config ``saved`` (already through :func:`autoln.config.with_defaults`)
    differs from ``current``, split in two lists of ``key (checkpoint X, now Y)``: keys that
    change what the run computes, which refuse a resume, and keys of ``place_keys`` (where and
    how fast it runs: device, compile, precision, the token cache's folder), which may change
    (a run moves from a GPU to a CPU when a lease ends; the checkpoint is portable). ``kind``
    (``search`` or ``retrain``): only its :data:`RESULT_SECTIONS` are compared; None: all but
    :data:`RESUME_FREE`."""
    keep = RESULT_SECTIONS.get(kind) if kind else None
    if keep is not None:
        saved = {k: v for k, v in saved.items() if k in keep}
        current = {k: v for k, v in current.items() if k in keep}
    diffs = config_differences(saved, current)
    place = [d for d in diffs if d.split(" ", 1)[0] in place_keys]
    return [d for d in diffs if d not in place], place


def load_for_resume(out: Path, kind: str, cfg: Config, finished: str,
                    check: Optional[Callable[[dict[str, Any]], None]] = None) -> Optional[dict[str, Any]]:
    """The checkpoint of the ``kind`` run (``search`` or ``retrain``) in ``out`` for
    ``--resume``, or None when the folder holds none yet (a run killed before its first
    checkpoint starts again from step 0). ``finished``: the file a finished run leaves.
    ``check(checkpoint)`` runs before the config comparison (the retrain's genotype check, whose
    message says more than the config keys a different genotype changes).

    Raises:
        OutputError: ``out`` is missing, empty (but for this command's lock file) or holds a
            finished run, the checkpoint is unreadable or of another kind of run.
        ConfigError: the checkpoint's config differs from ``cfg`` in a key that changes what
            the run computes (:func:`resume_differences`); the message names every such key.
            A key of :data:`autoln.config.PLACE_KEYS` may differ: a ``note:`` line names it.
    """
    if not out.is_dir():
        raise OutputError(f"--resume: {out} is not a run folder (it does not exist)")
    if not any(p.name != LOCK_FILE for p in out.iterdir()):  # this command's lock file only
        raise OutputError(f"--resume: {out} is not a run folder (it is empty): there is nothing to resume; start the run "
                          "without --resume")
    if (out / finished).exists():
        raise OutputError(f"--resume: {out} holds a finished {kind} ({finished}); nothing to resume "
                          "(to start it again, run the command with --overwrite in place of --resume)")
    path = out / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: say which, never a traceback
        raise OutputError(f"--resume: {path} is not a readable autoln checkpoint ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(ckpt, dict) or ckpt.get("kind") != kind:
        found = ckpt.get("kind") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise OutputError(f"--resume: {path} is a {found!r} checkpoint, not a {kind!r} one")
    if check is not None:
        check(ckpt)
    saved = with_defaults(ckpt["config"])
    diffs, place = resume_differences(saved, cfg.to_dict(), kind)
    diffs, moved = moved_corpus(diffs, ckpt.get("data_fingerprint"), cfg)
    if diffs:
        raise ConfigError(f"--resume: the config differs from the checkpoint's in {len(diffs)} key(s): " + "; ".join(diffs)
                          + f". Resume with the run's own config (--config {out / 'config.yaml'}, without the --set of those "
                          "keys), or start a new run (--overwrite in place of --resume, or another --out)")
    if moved and distributed.is_main():
        print(f"note: --resume: {moved}", file=sys.stderr)
    place += thread_change(ckpt)
    if place and distributed.is_main():
        print(f"note: --resume with {'; '.join(place)}: {NOT_BITWISE}", file=sys.stderr)
    return ckpt


def thread_change(ckpt: dict) -> list[str]:
    """``["torch threads (checkpoint M, now N)"]`` when this process runs ``torch.get_num_threads()``
    threads and the checkpoint's run recorded another count (its sums then add in another order:
    results some 1e-7 apart), else ``[]``; a checkpoint without the count says nothing."""
    then, now = ckpt.get("threads"), torch.get_num_threads()
    return [f"torch threads (checkpoint {then}, now {now})"] if then is not None and then != now else []


def check_corpus_there(cfg: Config) -> None:
    """For ``--resume``: refuse a ``data.corpus`` path that is not there with the way on, before
    anything reads it (the run's own config names the corpus where it was).

    Raises:
        DataError: naming the path, and that a corpus of the same bytes may move."""
    from autoln.core.errors import DataError

    corpus = cfg.data.corpus
    if corpus != "stdlib" and not Path(corpus).expanduser().exists():
        raise DataError(f"data.corpus: {corpus} does not exist; if the corpus moved (another machine, another folder), resume "
                        "with --set data.corpus=<where it is now>: a corpus of the same bytes may move, the checkpoint knows "
                        "them by their fingerprint")


def moved_corpus(diffs: list[str], fingerprint: Optional[str], cfg: Config) -> tuple[list[str], Optional[str]]:
    """``diffs`` (:func:`resume_differences`) without ``data.corpus`` when the corpus only moved:
    the corpus now at ``cfg.data.corpus`` has the content ``fingerprint`` the checkpoint recorded
    (SHA-256 of its bytes, :attr:`autoln.data.Corpus.fingerprint`); then also the note that says
    so. A corpus of other bytes stays a difference, and says so; so does one of a checkpoint
    that recorded no fingerprint (made before autoln kept it), which cannot be told from another.

    Raises:
        DataError: the corpus now named cannot be read (:func:`autoln.data.load_corpus`)."""
    from autoln.data import load_corpus

    at = [i for i, d in enumerate(diffs) if d.startswith("data.corpus ")]
    if not at:
        return diffs, None
    i, out = at[0], list(diffs)
    if fingerprint is None:
        out[i] += (" (this checkpoint records no fingerprint of its corpus's bytes, so a moved corpus cannot be told from "
                   "another: resume with the corpus at its old path)")
        return out, None
    now = load_corpus(cfg.data).fingerprint
    if now != fingerprint:
        out[i] += f" (another corpus: its bytes' fingerprint is {now[:12]}, the checkpoint's {fingerprint[:12]})"
        return out, None
    return out[:i] + out[i + 1:], (f"the corpus moved {diffs[i][len('data.corpus '):]}; its bytes are the checkpoint's "
                                   f"(fingerprint {fingerprint[:12]}), so the run goes on with it")


class StopSignals:
    """Context manager for SIGINT, SIGTERM and the other :data:`STOP_SIGNALS` during a run.

    The first signal sets :attr:`received`: the training loop finishes its step, writes a
    checkpoint and stops (:meth:`requested`, then :class:`Interrupted`). A second signal ends
    the process at once with status ``128 + signum`` (130 or 143), even inside a long step.

    Python runs a signal handler only between bytecodes of the main thread, so a handler
    alone cannot see a signal while one long torch call (a huge attention, say) holds the
    main thread. The signals are therefore also counted by a watcher thread woken by
    :func:`signal.set_wakeup_fd`, to which the C-level handler writes each signal's number
    as it arrives; torch releases the GIL inside its operators, so the watcher runs during
    them. The checkpoint of the last finished step stays on disk (checkpoints are written
    atomically), so nothing finished is lost. Outside the main thread it does nothing.

    Each signal is acknowledged on stderr at once: the first says when the run will stop
    (:attr:`when`, which the run sets as it moves from set-up to steps to its final
    evaluation), the second whether a checkpoint exists to continue from; the second also
    deletes the temporary file of a checkpoint being written at that moment.

    Args:
        checkpoint: the run's checkpoint file, named in the second signal's message (whether
            it exists then decides what the message says); None in tests.
    """

    #: :attr:`when` during the training steps
    IN_STEPS = "at the end of the step in progress, after writing a checkpoint"

    def __init__(self, checkpoint: Optional[Path] = None, resume_hint: Optional[str] = None) -> None:
        self.checkpoint = checkpoint
        #: how to continue, for the messages (default: this process's command with --resume)
        self.resume_hint = resume_hint
        #: what the first signal does now, for its acknowledgement; the run updates it as it goes
        #: (to :attr:`IN_STEPS` when its steps begin)
        self.when = "before the first step (the run is setting up; no checkpoint is written)"
        self.received: Optional[int] = None
        self._saved: dict[int, Any] = {}
        self._count = 0
        self._lock = threading.Lock()
        self._pipe: Optional[tuple[int, int]] = None
        self._old_wakeup = -1
        self._watcher: Optional[threading.Thread] = None

    def _note(self, signum: int) -> None:
        """Count one arrival of ``signum``; the second one ends the process."""
        with self._lock:
            self._count += 1
            self.received = self.received or signum
            second = self._count >= 2
        name = signal.Signals(signum).name
        if not second:
            if distributed.is_main():  # torchrun sends each process the signal: one acknowledgement
                sys.stderr.write(f"\n{name}: stopping {self.when}; send it again (e.g. Ctrl-C) to stop at once\n")
                sys.stderr.flush()
            return
        if self.checkpoint is not None:
            remove_stale_temps(self.checkpoint)  # a checkpoint being written now is abandoned, not half-kept
        if self.checkpoint is not None and self.checkpoint.exists():
            kept = (f"the last checkpoint written ({self.checkpoint}) stays on disk; continue with: "
                    f"{self.resume_hint or resume_command(self.checkpoint.parent)}")
        elif self.checkpoint is not None:
            kept = f"no checkpoint was written yet, {NOTHING_TO_RESUME}{'' if self.resume_hint else ': ' + again_command()}"
        else:
            kept = "the last checkpoint written stays on disk"
        if distributed.is_main():
            sys.stderr.write(f"\nsecond signal ({name}): stopping at once; {kept}\n")
            sys.stderr.flush()
        os._exit(128 + signum)

    def _handle(self, signum, frame) -> None:
        # the watcher thread counts the arrivals; without one (no wakeup fd), count here
        if self._watcher is None:
            self._note(signum)

    def _watch(self, fd: int) -> None:
        while True:
            try:
                data = os.read(fd, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in STOP_SIGNALS:
                    self._note(signum)

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in STOP_SIGNALS:
            self._saved[sig] = signal.signal(sig, self._handle)
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            self._old_wakeup = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # an fd already taken by an event loop: count in the handler instead
            os.close(r), os.close(w)
            return self
        self._pipe = (r, w)
        self._watcher = threading.Thread(target=self._watch, args=(r,), name="autoln-signals", daemon=True)
        self._watcher.start()
        return self

    def requested(self, device: torch.device) -> bool:
        """True when a signal came, on this or (under ``torchrun``) any process."""
        return distributed.any_true(self.received is not None, device)

    def __exit__(self, *exc) -> None:
        if self._pipe is not None:
            signal.set_wakeup_fd(self._old_wakeup)
            r, w = self._pipe
            os.close(w)  # the watcher's read returns b"" and it ends
            self._watcher.join(timeout=5)
            os.close(r)
            self._pipe, self._watcher = None, None
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)
        self._saved.clear()


def space_message(exc: OSError, checkpoint: Optional[Path], hint: str) -> str:
    """The one line of a write that failed for want of space (``exc``: an ``OSError`` whose
    ``filename`` is the file, :func:`autoln.core.io.write_failure`): the file and the cause, the
    previous ``checkpoint`` kept (or none written yet), and ``hint``, the command that goes on."""
    import errno as errno_names

    cause = exc.strerror or str(exc)
    if exc.errno == errno_names.EFBIG:
        cause += " (over this process's file-size limit, ulimit -f)"
    if checkpoint is None:
        kept = "the files written before it are kept"
    elif checkpoint.is_file():
        kept = f"the previous checkpoint {checkpoint} is kept"
    else:
        kept = f"no checkpoint had been written in {checkpoint.parent} yet"
    file = cut(str(exc.filename)) if exc.filename else "a file (the library that wrote it did not say which)"
    return f"cannot write {file}: {cause}; {kept}. Once there is space, continue with: {hint}"


@contextmanager
def space_errors_kept(out: Path, resume_hint: Optional[str] = None) -> Iterator[None]:
    """Around a run in ``out``: a write that fails for want of space (:func:`autoln.core.io.is_space_error`,
    at any writer: checkpoint, event file, ``metrics.json``, genotype, figures) becomes a
    :class:`autoln.core.errors.WriteError` whose one line names the file, the cause, the kept
    checkpoint and the command that resumes (``resume_hint``, default :func:`autoln.core.commands.resume_command`).
    Writes are atomic (:mod:`autoln.core.io`), so the previous checkpoint is whole and ``--resume``
    continues from it once there is space.

    Raises:
        WriteError: as above; every other exception passes unchanged."""
    from autoln.core.errors import WriteError
    from autoln.core.io import is_space_error, os_error_in

    try:
        yield
    except Exception as exc:
        if not is_space_error(exc):
            raise
        cause = os_error_in(exc)
        raise WriteError(space_message(cause, Path(out) / CHECKPOINT_FILE, resume_hint or resume_command(Path(out)))) from None


class Interrupted(KeyboardInterrupt):
    """A run stopped by SIGINT or SIGTERM after writing its checkpoint; ``signum`` is the
    signal (the command exits with ``128 + signum``: 130 or 143)."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum

    def __reduce__(self):
        """Pickled whole (a ``--workers`` process sends it to the command that started it)."""
        return (Interrupted, (self.signum, str(self)))


class Checkpointer:
    """When a run writes its checkpoint and which one is the last good one.

    Args:
        out: the run folder (the file is ``out/checkpoint.pt``).
        every: ``checkpoint.every`` (0: only when forced).
        write: False on the processes that do not write (ranks > 0 under ``torchrun``).
        last_step: the step of the checkpoint a resumed run started from.
        resume_hint: how to continue the run, for the messages (``autoln.search`` names its own
            call); default this process's command with ``--resume``.
    """

    def __init__(self, out: Path, every: int, write: bool, last_step: Optional[int] = None,
                 resume_hint: Optional[str] = None) -> None:
        self.path, self.every, self.write, self.last_step = out / CHECKPOINT_FILE, every, write, last_step
        #: how to continue, for the messages (default: this process's command with --resume)
        self.resume_hint = resume_hint
        if write:
            remove_stale_temps(self.path)  # left by a process killed while writing its checkpoint

    @property
    def next_step(self) -> int:
        """The step the run does next: 1, or the one after the checkpoint it resumes from."""
        return 1 if self.last_step is None else self.last_step + 1

    def due(self, step: int) -> bool:
        """A periodic checkpoint is due after ``step``."""
        return self.every > 0 and step % self.every == 0

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Write ``state`` (with the random states) as the checkpoint of ``step``, atomically;
        a checkpoint file removed since the last one is simply written again. First checks
        that this process still holds its folders (:func:`autoln.core.locks.check_held`: a removed
        lock file is re-created).

        Raises:
            StateLost: the run folder was removed, or another command took it after its lock
                file was removed (nothing is written then; the message names the last good
                checkpoint and the command that continues).
        """
        if self.write:
            from autoln.core.locks import check_held

            check_held(f"; {self.describe()}, unless that command has replaced it; once it has ended, continue with: "
                       f"{self.resume_hint or resume_command(self.path.parent)}")
            save(self.path, state)
        self.last_step = step

    def end_step(self, step: int, evaluation: bool, signals: "StopSignals", device: torch.device,
                 write: Callable[[int], None]) -> None:
        """After ``step``: ``write(step)`` the checkpoint when an evaluation, the period or a
        stop signal (on any process) asks for it; after a signal, raise :class:`Interrupted`.

        Raises:
            Interrupted: SIGINT or SIGTERM arrived; the checkpoint of ``step`` is written.
        """
        interrupted = signals.requested(device)
        if evaluation or interrupted or self.due(step):
            write(step)
        if interrupted:
            raise Interrupted(signals.received or signal.SIGTERM,
                              f"stopped by signal after step {step}; checkpoint written to {self.path}; "
                              f"continue with: {self.resume_hint or resume_command(self.path.parent)}")

    def stop_if_signalled(self, signals: "StopSignals", device: torch.device, where: str) -> None:
        """Raise :class:`Interrupted` when a stop signal came outside a training step (``where``:
        e.g. "before the first step", "during the final evaluation"). Nothing is written: the
        message says which checkpoint, if any, the run can continue from.

        Raises:
            Interrupted: SIGINT or SIGTERM arrived.
        """
        if not signals.requested(device):
            return
        if self.last_step is None:
            kept = f"no checkpoint was written, {NOTHING_TO_RESUME}{'' if self.resume_hint else ': ' + again_command()}"
        else:
            kept = f"{self.path} holds step {self.last_step}; continue with: {self.resume_hint or resume_command(self.path.parent)}"
        raise Interrupted(signals.received or signal.SIGTERM, f"stopped by signal {where}; {kept}")

    def new_run(self) -> str:
        """For a divergence message: how a new run goes in this folder (`` (--overwrite replaces
        this one, ...)``, :data:`NEW_RUN`), or nothing when a ``resume_hint`` names the caller's
        own way (``autoln.search``'s ``overwrite=True``)."""
        return "" if self.resume_hint else f" ({NEW_RUN})"

    def describe(self) -> str:
        """Where the last good checkpoint is, for messages."""
        if self.last_step is None:
            return "no checkpoint was written before it"
        return f"the last good checkpoint is {self.path}, step {self.last_step}"

    def diverged(self, section: str, policy: str, step: int, what: str, state: dict, log) -> None:
        """Apply ``<section>.on_divergence`` to a step whose loss or gradient was NaN or inf
        (its update was not applied): ``stop`` raises; ``skip_batch`` counts the step in
        ``state["skipped_batches"]`` and logs ``train/skipped_batches``.

        Raises:
            DivergenceError: ``policy`` is ``stop``; names the step, ``what`` (the values)
                and the last good checkpoint.
        """
        if policy == "stop":
            raise DivergenceError(f"{section} diverged at step {step}: {what}; {self.describe()}. Try a new run{self.new_run()} with a "
                                  f"lower {section}.lr or more {section}.warmup_steps, or {section}.on_divergence=skip_batch")
        state["skipped_batches"] += 1
        log.scalar("train/skipped_batches", state["skipped_batches"], step)
