"""Splits and batch sampling (docs/design.md §4): D_w and D_alpha, random training windows,
and the fixed evaluation windows.

- The training split is cut into chunks; a seeded permutation gives a disjoint D_w (weights)
  and D_alpha (alphas). Every training window lies inside one chunk, so D_w and D_alpha share
  no window. Batches are random windows drawn by persistent seeded samplers.
"""

from __future__ import annotations

from typing import Iterator, Optional

import numpy as np
import torch

from autoln.core.errors import DataError

def arch_split(n_tokens: int, context: int, chunk_tokens: int, arch_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut ``[0, n_tokens)`` into chunks and assign them to D_w and D_alpha by a seeded permutation.

    The chunk length is ``max(context + 1, min(chunk_tokens, n_tokens // 2))``; the last
    partial chunk is dropped. ``round(n_chunks * arch_fraction)`` chunks (at least 1, at
    most ``n_chunks - 1``) go to D_alpha.

    Returns:
        ``(w_chunks, alpha_chunks)``: int64 arrays ``(n, 2)`` of ``[start, end)`` token ranges.

    Raises:
        DataError: fewer than two chunks fit.
    """
    length = max(context + 1, min(chunk_tokens, n_tokens // 2))
    n_chunks = n_tokens // length
    if n_chunks < 2:
        raise DataError(f"the train split has {n_tokens} tokens: too few for two chunks of {length} (model.context + 1)")
    starts = np.arange(n_chunks, dtype=np.int64) * length
    chunks = np.stack([starts, starts + length], axis=1)
    perm = np.random.default_rng(seed).permutation(n_chunks)
    n_alpha = min(max(1, round(n_chunks * arch_fraction)), n_chunks - 1)
    return np.sort(chunks[perm[n_alpha:]], axis=0), np.sort(chunks[perm[:n_alpha]], axis=0)


class WindowSampler:
    """Persistent seeded sampler of random contiguous windows inside given token ranges.

    Args:
        tokens: 1-D token array.
        chunks: ``(n, 2)`` ``[start, end)`` ranges; a window of ``context + 1`` tokens never
            crosses a range's end. Ranges are drawn in proportion to their number of windows.
        context: ``T``; batch_size: ``B``; seed: seeds a ``numpy.random.Generator``.

    ``sample()`` returns ``(x, y)`` int64 tensors ``(B, T)`` with ``y`` shifted by one token.
    """

    def __init__(self, tokens: np.ndarray, chunks: np.ndarray, context: int, batch_size: int, seed: int) -> None:
        self.tokens, self.context, self.batch_size = tokens, context, batch_size
        self.starts = chunks[:, 0].astype(np.int64)
        counts = (chunks[:, 1] - chunks[:, 0] - context).astype(np.float64)
        if (counts <= 0).any():
            raise ValueError("every chunk must hold more than context tokens")
        self.p = counts / counts.sum()
        self.counts = counts.astype(np.int64)
        self.rng = np.random.default_rng(seed)

    def sample_starts(self) -> np.ndarray:
        """Start positions ``(B,)`` of the next batch's windows."""
        c = self.rng.choice(len(self.starts), size=self.batch_size, p=self.p)
        return self.starts[c] + (self.rng.random(self.batch_size) * self.counts[c]).astype(np.int64)

    def sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch ``(x, y)``, each ``(B, T)`` int64."""
        return windows(self.tokens, self.sample_starts(), self.context)

    def state_dict(self) -> dict:
        """The generator state, for checkpoints."""
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.rng.bit_generator.state = state["rng"]


def windows(tokens: np.ndarray, starts: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` int64 tensors ``(len(starts), context)``: ``x = tokens[s:s+T]``, ``y = tokens[s+1:s+T+1]``."""
    idx = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(context + 1)
    block = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
    return block[:, :-1], block[:, 1:]


def eval_starts(n_tokens: int, context: int, n_windows: Optional[int]) -> np.ndarray:
    """Starts of non-overlapping evaluation windows, evenly spaced over a split.

    ``n_windows=None`` (or more than fit) takes every non-overlapping window in order.
    """
    total = (n_tokens - 1) // context
    if n_windows is None or n_windows >= total:
        return np.arange(total, dtype=np.int64) * context
    return np.linspace(0, total - 1, n_windows).round().astype(np.int64) * context


def estimate_starts(final: np.ndarray, n_windows: Optional[int]) -> np.ndarray:
    """The windows of the evaluations before the last step: ``n_windows`` of the ``final``
    window starts (:func:`eval_starts` of ``final_eval_windows``), evenly spaced among them, so
    every estimate measures a subset of the very windows of the final number (all of them for
    ``None`` or ``n_windows >= len(final)``)."""
    if n_windows is None or n_windows >= len(final):
        return final
    return final[np.linspace(0, len(final) - 1, n_windows).round().astype(np.int64)]


def eval_batches(tokens: np.ndarray, starts: np.ndarray, context: int, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches ``(x, y)`` ``(<=B, T)`` over the given window starts, in order."""
    for i in range(0, len(starts), batch_size):
        yield windows(tokens, starts[i:i + batch_size], context)
