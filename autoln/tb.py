"""TensorBoard logging: scalars, the alpha matrix as scalars and as an image, text.

Tags written (both scripts): ``train/loss``, ``valid/loss``, ``valid/<headline metric>``,
``lr/weights`` (and ``lr/alphas`` in search), ``alpha/<site>/<candidate>``, the image
``alphas`` (sites x candidates heat map), and the texts ``genotype`` and ``config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np


class Logger:
    """A thin wrapper over ``torch.utils.tensorboard.SummaryWriter`` that does nothing when
    disabled (``logging.tensorboard: false``).

    Args:
        out_dir: the run folder; event files go directly in it.
        enabled: write event files or not.
        purge_step: a resumed run's first step: TensorBoard drops the events at and after it
            that the interrupted run wrote after its checkpoint.
    """

    def __init__(self, out_dir: str | Path, enabled: bool = True, purge_step: Optional[int] = None) -> None:
        self.writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(out_dir), purge_step=purge_step)

    def scalar(self, tag: str, value: float, step: int) -> None:
        """One scalar point."""
        if self.writer:
            self.writer.add_scalar(tag, value, step)

    def scalars(self, values: dict[str, float], step: int, prefix: str) -> None:
        """Several scalars as ``<prefix>/<key>``."""
        for key, value in values.items():
            self.scalar(f"{prefix}/{key}", value, step)

    def text(self, tag: str, text: str, step: int = 0) -> None:
        """Text, shown as Markdown (wrap code in a fenced block to keep it verbatim)."""
        if self.writer:
            self.writer.add_text(tag, text, step)

    def alphas(self, probs: np.ndarray, sites: Sequence[str], candidates: Sequence[str], step: int) -> None:
        """The mixing probabilities ``(n_sites, K)``: one scalar ``alpha/<site>/<candidate>``
        each and a heat-map image ``alphas``."""
        if not self.writer:
            return
        for i, site in enumerate(sites):
            for k, cand in enumerate(candidates):
                self.writer.add_scalar(f"alpha/{site}/{cand}", float(probs[i, k]), step)
        self.writer.add_figure("alphas", alpha_figure(probs, sites, candidates, title=f"step {step}"), step)

    def figure(self, tag: str, fig, step: int) -> None:
        """A matplotlib figure as an image (the figure stays open for the caller)."""
        if self.writer:
            self.writer.add_figure(tag, fig, step, close=False)

    def flush(self) -> None:
        """Write pending events to disk."""
        if self.writer:
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        if self.writer:
            self.writer.close()


def alpha_figure(probs: np.ndarray, sites: Sequence[str], candidates: Sequence[str], title: Optional[str] = None):
    """A matplotlib figure of the ``(n_sites, K)`` probability matrix, values annotated."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(candidates), 0.8 + 0.32 * len(sites)))
    im = ax.imshow(probs, vmin=0.0, vmax=1.0, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(candidates)), candidates)
    ax.set_yticks(range(len(sites)), sites)
    for i in range(probs.shape[0]):
        for k in range(probs.shape[1]):
            ax.text(k, i, f"{probs[i, k]:.2f}", ha="center", va="center", fontsize=7,
                    color="black" if probs[i, k] > 0.6 else "white")
    if title:
        ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.05)
    fig.tight_layout()
    return fig
