"""A user's own data and training loop, as nanoGPT writes them (Karpathy's ``data/shakespeare_char/
prepare.py`` and ``train.py``), for the model of ``gpt.py``: what ``search_gpt.py`` trains
each model with. Nothing here is autoln's.

- Data: a nanoGPT data folder (``train.bin``/``val.bin`` uint16 token ids, ``meta.pkl`` with
  ``vocab_size``), or a text file read as characters the way ``shakespeare_char/prepare.py``
  does (the sorted set of its characters is the vocabulary; the first 90 % trains).
- Training: AdamW (betas 0.9/0.99, weight decay 0.1 on the matrices only), linear warm-up over
  ``warmup`` steps, cosine decay to ``min_lr`` at the last step, gradient clipping at 1.0, random
  windows drawn as ``get_batch`` draws them: nanoGPT's ``shakespeare_char`` recipe at a
  smaller size (lr 1e-3, 100 warm-up steps, min_lr 1e-4).
- Evaluation: the mean cross-entropy (nats per token) over every non-overlapping window of the
  validation split, so two models are measured on exactly the same tokens.
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn


@dataclass
class Recipe:
    """nanoGPT's training settings (``train.py``'s globals, ``shakespeare_char``'s values for lr,
    warm-up, min_lr, beta2 and clipping)."""

    steps: int = 500
    batch_size: int = 32
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0

    def lr_at(self, it: int) -> float:
        """nanoGPT's ``get_lr``: linear warm-up, then cosine from ``lr`` to ``min_lr`` at ``steps``."""
        if it < self.warmup:
            return self.lr * (it + 1) / (self.warmup + 1)
        if it > self.steps:
            return self.min_lr
        ratio = (it - self.warmup) / max(1, self.steps - self.warmup)
        return self.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (self.lr - self.min_lr)


def load_data(path: str | Path) -> tuple[np.ndarray, np.ndarray, int]:
    """``(train, val, vocab_size)``: token ids (uint16 arrays) of a nanoGPT data folder or of a
    text file read as characters.

    Raises:
        ValueError: no such path, a folder without ``train.bin``/``val.bin``, or a file that
            cannot be read as UTF-8 text.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{path}: no such file or folder")
    if path.is_dir():
        if not (path / "train.bin").is_file() or not (path / "val.bin").is_file():
            raise ValueError(f"{path}: expected nanoGPT's train.bin and val.bin (and meta.pkl) in the folder")
        train = np.fromfile(path / "train.bin", dtype=np.uint16)
        val = np.fromfile(path / "val.bin", dtype=np.uint16)
        vocab = int(max(train.max(), val.max())) + 1
        if (path / "meta.pkl").is_file():
            with open(path / "meta.pkl", "rb") as f:
                vocab = int(pickle.load(f)["vocab_size"])
        return train, val, vocab
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read as UTF-8 text ({exc})") from None
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    cut = int(len(ids) * 0.9)
    return ids[:cut], ids[cut:], len(chars)


def batches(data: np.ndarray, block_size: int, batch_size: int, seed: int):
    """Random windows of ``data`` forever, as nanoGPT's ``get_batch``: ``(x, y)`` int64 ``(B, T)``."""
    g = torch.Generator().manual_seed(seed)
    while True:
        ix = torch.randint(len(data) - block_size, (batch_size,), generator=g).tolist()
        x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
        yield x, y


def optimizer(model: nn.Module, recipe: Recipe) -> torch.optim.AdamW:
    """nanoGPT's ``configure_optimizers``: weight decay on parameters of two or more dimensions."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": recipe.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=recipe.lr, betas=recipe.betas)


def train(model: nn.Module, data: np.ndarray, block_size: int, recipe: Recipe, seed: int) -> list[float]:
    """nanoGPT's training loop over ``recipe.steps`` steps; returns the training losses (nats per token)."""
    opt = optimizer(model, recipe)
    stream = batches(data, block_size, recipe.batch_size, seed)
    losses = []
    model.train()
    for it in range(recipe.steps):
        for group in opt.param_groups:
            group["lr"] = recipe.lr_at(it)
        x, y = next(stream)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if recipe.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        opt.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def val_loss(model: nn.Module, data: np.ndarray, block_size: int, batch_size: int = 64) -> float:
    """Mean cross-entropy (nats per token) over every non-overlapping window of ``data``."""
    model.eval()
    n = (len(data) - 1) // block_size
    total = 0.0
    for s in range(0, n, batch_size):
        starts = [i * block_size for i in range(s, min(n, s + batch_size))]
        x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in starts])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in starts])
        total += float(model(x, y)[1]) * len(starts)
    model.train()
    return total / n
