"""TensorBoard logging: scalars, the mixing probabilities as scalars and as an image, text.

Tags written by both scripts: ``train/loss``, ``valid/loss``, ``valid/<headline metric>``,
``lr/weights``, and the texts ``genotype`` and ``config``. The search adds ``lr/alphas`` and
the architecture's mixing probabilities: ``alpha/<site>/<candidate>`` from step 0 every
``logging.log_every`` steps, drawn as one multi-line chart per site (the *Custom Scalars*
dashboard, :meth:`Logger.layout`), and the image ``alphas``, a sites x candidates heat map at
each evaluation. A retrain has no alphas: it writes none of these, and gives its genotype as
text.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import numpy as np


class Logger:
    """A thin wrapper over ``torch.utils.tensorboard.SummaryWriter`` that does nothing when
    disabled (``logging.tensorboard: false``).

    TensorBoard writes its event file in a background thread and raises that thread's error
    at a later call, as a bare ``OSError`` without the file's name. Every call here re-raises
    it as ``OSError(errno, strerror, <event file>)`` (:func:`autoln.core.io.write_failure`), so a
    full disk or a file-size limit is reported in one line naming the event file; the
    thread's own traceback is not printed (:func:`quiet_writer_threads`), and :meth:`close`
    after such a failure does not raise it a second time.

    Args:
        out_dir: the run folder; event files go directly in it.
        enabled: write event files or not.
        purge_step: a resumed run's first step: TensorBoard drops the events at and after it
            that the interrupted run wrote after its checkpoint.

    Raises:
        OSError: the event file cannot be created or written (``filename``: its path).
    """

    def __init__(self, out_dir: str | Path, enabled: bool = True, purge_step: Optional[int] = None) -> None:
        self.writer, self.out_dir, self.failed = None, Path(out_dir), False  # failed: a write raised
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            quiet_writer_threads()
            wait_past_event_files(self.out_dir)
            self.writer = self._guard(lambda: SummaryWriter(log_dir=str(out_dir), purge_step=purge_step))

    def event_file(self) -> Path:
        """The event file this logger writes (its folder while none is open)."""
        try:
            return Path(self.writer.file_writer.event_writer._file_name)
        except AttributeError:
            return self.out_dir

    def _guard(self, call):
        try:
            return call()
        except Exception as exc:
            from autoln.core.io import write_failure

            failure = write_failure(exc, self.event_file() if self.writer else self.out_dir)
            if failure is None:
                raise
            self.failed = True
            raise failure from None

    def scalar(self, tag: str, value: float, step: int) -> None:
        """One scalar point."""
        if self.writer:
            self._guard(lambda: self.writer.add_scalar(tag, value, step))

    def scalars(self, values: dict[str, float], step: int, prefix: str) -> None:
        """Several scalars as ``<prefix>/<key>``."""
        for key, value in values.items():
            self.scalar(f"{prefix}/{key}", value, step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        """Text, shown as Markdown (wrap code in a fenced block to keep it verbatim)."""
        if self.writer:
            self._guard(lambda: self.writer.add_text(tag, text, step))

    def layout(self, sites: Sequence[str], candidates: Sequence[str]) -> None:
        """The Custom Scalars layout: one chart per site (category ``mixing probabilities``)
        with one line per candidate, tags ``alpha/<site>/<candidate>`` on a shared y-axis."""
        if self.writer:
            charts = {site: ["Multiline", [f"alpha/{site}/{c}" for c in candidates]] for site in sites}
            self._guard(lambda: self.writer.add_custom_scalars({"mixing probabilities (per site)": charts}))

    def alphas(self, probs: np.ndarray, sites: Sequence[str], candidates: Sequence[str], step: int,
               image: bool = False, chosen: Optional[Sequence[int]] = None) -> None:
        """The mixing probabilities ``(n_sites, K)``: one scalar ``alpha/<site>/<candidate>``
        each, and with ``image`` the heat map ``alphas`` (:func:`alpha_figure`; ``chosen``: per
        site the selected candidate's index, boxed)."""
        if not self.writer:
            return
        for i, site in enumerate(sites):
            for k, cand in enumerate(candidates):
                self.scalar(f"alpha/{site}/{cand}", float(probs[i, k]), step)
        if image:
            fig = alpha_figure(probs, sites, candidates, title=f"step {step}", chosen=chosen)
            self._guard(lambda: self.writer.add_figure("alphas", fig, step))

    def figure(self, tag: str, fig, step: int) -> None:
        """A matplotlib figure as an image (the figure stays open for the caller)."""
        if self.writer:
            self._guard(lambda: self.writer.add_figure(tag, fig, step, close=False))

    def hparams(self, params: dict, metrics: dict) -> None:
        """Hyperparameters and final metrics for the HParams view, as this folder's own run."""
        if self.writer:
            self._guard(lambda: self.writer.add_hparams(params, metrics, run_name="."))

    def flush(self) -> None:
        """Write pending events to disk."""
        if self.writer:
            self._guard(self.writer.flush)

    def close(self) -> None:
        """Flush and close the event file. After a failed write (already raised), or while
        another exception is on its way out (a ``finally`` block after a failed checkpoint),
        it closes quietly: the run ends with that one error, not another one over it."""
        if not self.writer:
            return
        quiet = self.failed or sys.exc_info()[1] is not None
        try:
            self._guard(self.writer.close)
        except OSError:
            if not quiet:
                raise
        finally:
            self.writer = None

    def __enter__(self) -> "Logger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def wait_past_event_files(out_dir: Path, clock=time.time, sleep=time.sleep) -> float:
    """Wait until the clock's whole second is past every event file already in ``out_dir``;
    returns the seconds waited (0.0 mostly).

    TensorBoard reads a folder's event files in the order of their names,
    ``events.out.tfevents.<10-digit second>.<host>.<pid>.<counter>``, and applies a resumed
    file's ``purge_step`` to what it read before it. Two files created in the same second sort
    by pid and then by a counter compared as text (``.10`` before ``.9``), so a run resumed
    within a second of its start could be read before the part it resumes, its purge step
    applied to nothing and its later steps drawn first. A new file whose second is greater
    than every existing one's always sorts after them; the wait is at most one second and
    happens only when a file of the current second is there (a resume right after the start);
    a file of a later second (a clock set back) is not waited for.
    """
    seconds = [int(part) for f in Path(out_dir).glob("events.out.tfevents.*")
               for part in f.name.split(".")[3:4] if part.isdigit()]
    if not seconds or int(clock()) != max(seconds):  # a file from the future (a clock set back): no wait
        return 0.0
    pause = max(seconds) + 1 - clock()
    sleep(pause)
    return pause


def quiet_writer_threads() -> None:
    """Install (once) a ``threading.excepthook`` that does not print the traceback of
    TensorBoard's event-writer thread (``_AsyncWriterThread``): the writer raises that error
    again in the calling thread, where :class:`Logger` reports it in one line. Every other
    thread's error goes to the previous hook as before."""
    import threading

    if getattr(threading.excepthook, "_autoln_quiet", False):
        return
    previous = threading.excepthook

    def hook(args) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and isinstance(args.exc_value, Exception):
            return
        previous(args)

    hook._autoln_quiet = True
    threading.excepthook = hook


def heat_scale(probs: np.ndarray) -> float:
    """Half-width of :func:`alpha_figure`'s colour scale: the largest ``|p - 1/K|`` of the
    ``(n_sites, K)`` matrix (at least 1e-3), so that a near-uniform matrix still shows its
    differences instead of one flat colour."""
    return max(float(np.abs(probs - 1.0 / probs.shape[1]).max()), 1e-3)


def alpha_figure(probs: np.ndarray, sites: Sequence[str], candidates: Sequence[str], title: Optional[str] = None,
                 chosen: Optional[Sequence[int]] = None):
    """A matplotlib heat map of the ``(n_sites, K)`` probability matrix: the colour is the
    difference from uniform ``p - 1/K`` on a diverging scale of half-width :func:`heat_scale`
    (red above uniform, blue below), each cell annotated with ``p`` at three decimals. With
    ``chosen`` (per site a candidate index: the genotype, which perturbation-based selection may
    take from a smaller probability) each chosen cell is boxed and its number starred."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    half = heat_scale(probs)
    fig, ax = plt.subplots(figsize=(1.4 + 1.1 * len(candidates), 0.9 + 0.32 * len(sites)))
    im = ax.imshow(probs - 1.0 / probs.shape[1], vmin=-half, vmax=half, cmap="RdBu_r", aspect="auto")
    ax.set_xticks(range(len(candidates)), candidates)
    ax.set_yticks(range(len(sites)), sites)
    for i in range(probs.shape[0]):
        for k in range(probs.shape[1]):
            dark = abs(probs[i, k] - 1.0 / probs.shape[1]) > 0.6 * half
            star = "*" if chosen is not None and chosen[i] == k else ""
            ax.text(k, i, f"{probs[i, k]:.3f}{star}", ha="center", va="center", fontsize=7, color="white" if dark else "black")
    if chosen is not None:
        for i, k in enumerate(chosen):
            ax.add_patch(matplotlib.patches.Rectangle((k - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
    boxed = "; boxed*: chosen" if chosen is not None else ""
    ax.set_title(f"{title + ': ' if title else ''}probability (colour: minus uniform 1/{probs.shape[1]}{boxed})", fontsize=8)
    fig.colorbar(im, ax=ax, fraction=0.05)
    fig.tight_layout()
    return fig


def alpha_curves_figure(history: Sequence, sites: Sequence[str], candidates: Sequence[str], chosen: Sequence[int],
                        search_steps: Optional[int] = None):
    """The mixing probabilities over the search, one panel per site and one coloured line per
    candidate (the same colour for a candidate in every panel, one legend), the chosen
    placement's line drawn thick and named in the panel's title. ``history``: ``(step,
    probabilities (n_sites, K))`` pairs in step order; ``chosen``: per site a candidate index.

    A site whose choice is not its largest final probability (the read-off's loss rises or
    scores overruled it, DARTS-PT's point that an alpha's size is not its operation's strength)
    says so in a red title, ``overruled: <largest> <p>``, in a red frame. With ``search_steps``
    and steps past it, a dashed line in every panel marks where the search's steps end and the
    read-off's fine-tuning begins."""
    import math as _math

    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    steps = [int(h[0]) for h in history]
    probs = np.asarray([h[1] for h in history], dtype=np.float64)  # (T, n_sites, K)
    cols = min(4, len(sites))
    rows = _math.ceil(len(sites) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 1.9 * rows + 0.6), squeeze=False, sharex=True, sharey=True)
    boundary = search_steps is not None and steps and steps[-1] > search_steps
    for i, site in enumerate(sites):
        ax = axes.flat[i]
        for k, cand in enumerate(candidates):
            ax.plot(steps, probs[:, i, k], color=f"C{k}", lw=2.6 if chosen[i] == k else 1.1, label=cand)
        top = int(probs[-1, i].argmax())
        if top != chosen[i]:
            ax.set_title(f"{site}: {candidates[chosen[i]]} (overruled: {candidates[top]} {probs[-1, i, top]:.2f})",
                         fontsize=8, color="red")
            for spine in ax.spines.values():
                spine.set_edgecolor("red")
                spine.set_linewidth(1.5)
        else:
            ax.set_title(f"{site}: {candidates[chosen[i]]}", fontsize=8)
        if boundary:
            ax.axvline(search_steps, color="0.3", ls="--", lw=0.9)
        ax.set_ylim(0, 1)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(sites):]:
        ax.set_visible(False)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=f"C{k}", lw=1.5) for k in range(len(candidates))]
    fig.legend(handles, list(candidates), loc="upper center", ncol=len(candidates), fontsize=8, frameon=False,
               title="mixing probability per site; thick line: the chosen placement; red: the read-off overruled the "
                     "largest probability", title_fontsize=8)
    fig.supxlabel(f"step (the search's {search_steps} steps, then, past the dashed line, the read-off's fine-tuning)"
                  if boundary else "step", fontsize=8)
    for row in range(rows):
        axes[row][0].set_ylabel("probability", fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.55 / (1.9 * rows + 0.6)))
    return fig


def write_alpha_pictures(out: Path, history: Sequence, sites: Sequence[str], candidates: Sequence[str],
                         chosen: Optional[Sequence[int]], log: "Logger", step: int,
                         search_steps: Optional[int] = None) -> list[Path]:
    """Write ``alphas.png`` (:func:`alpha_curves_figure`, the search's end at ``search_steps``) and ``alphas_heatmap.png`` (the final
    probabilities, :func:`alpha_figure`, chosen cells boxed) into the search folder ``out``,
    atomically, and the curves to TensorBoard's Images tab (``alpha_curves`` at ``step``).
    ``chosen`` None: the argmax of the last probabilities. Returns the two paths."""
    import matplotlib.pyplot as plt

    from autoln.core.io import save_figure_atomic

    final = np.asarray(history[-1][1], dtype=np.float64)
    chosen = [int(k) for k in (final.argmax(-1) if chosen is None else chosen)]
    curves = alpha_curves_figure(history, sites, candidates, chosen, search_steps)
    heat = alpha_figure(final, sites, candidates, title=f"step {step}", chosen=chosen)
    paths = [save_figure_atomic(curves, Path(out) / "alphas.png"), save_figure_atomic(heat, Path(out) / "alphas_heatmap.png")]
    log.figure("alpha_curves", curves, step)
    plt.close(curves)
    plt.close(heat)
    return paths
