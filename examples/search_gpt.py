"""Search the norm placement of a nanoGPT-style model (examples/gpt.py) with autoln's public API,
then retrain the answer with this script's own training loop, beside plain Pre-LN.

    python examples/search_gpt.py --data input.txt [--search-steps 300] [--retrain-steps 600] [--out runs/example]

``--data``: any text file, read as bytes (e.g. tiny Shakespeare's ``input.txt``; the default is
this repository's README, enough to see it run, too small for an answer worth keeping). It
writes ``<out>/genotype.json`` (autoln's site genotype) and ``<out>/derived.pt`` (the retrained
model's ``state_dict``) and prints the valid loss (nats per byte) of the derived model and of
nanoGPT's Pre-LN trained the same way.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt import GPT, GPTConfig  # noqa: E402

import autoln  # noqa: E402

CANDIDATES = ("pre", "post", "deepnorm")


def batches(data: np.ndarray, block_size: int, batch_size: int, seed: int):
    """Random windows of ``data`` forever, as nanoGPT's ``get_batch``: ``(x, y)`` int64 ``(B, T)``."""
    g = torch.Generator().manual_seed(seed)
    while True:
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=g).tolist()
        x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
        yield x, y


@torch.no_grad()
def valid_loss(model: GPT, data: np.ndarray, block_size: int, windows: int = 32) -> float:
    """Mean cross-entropy (nats per byte) over ``windows`` evenly spaced windows of ``data``."""
    model.eval()
    starts = np.linspace(0, len(data) - block_size - 2, windows).astype(int)
    x = torch.stack([torch.from_numpy(data[s:s + block_size].astype(np.int64)) for s in starts])
    y = torch.stack([torch.from_numpy(data[s + 1:s + 1 + block_size].astype(np.int64)) for s in starts])
    loss = float(model(x, y)[1])
    model.train()
    return loss


def train(model: GPT, data: np.ndarray, cfg: GPTConfig, steps: int, batch_size: int, lr: float, seed: int) -> None:
    """This script's own loop: AdamW, linear warm-up over a tenth of the steps, then constant."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    stream = batches(data, cfg.block_size, batch_size, seed)
    warmup = max(1, steps // 10)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        x, y = next(stream)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[1] / "README.md"))
    p.add_argument("--search-steps", type=int, default=300)
    p.add_argument("--retrain-steps", type=int, default=600)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--block-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--out", default="runs/example")
    args = p.parse_args(argv)
    try:
        raw = np.frombuffer(Path(args.data).read_bytes(), dtype=np.uint8)
    except OSError as exc:
        p.error(f"--data {args.data}: {exc.strerror or exc}")
    if len(raw) < 20 * (args.block_size + 2):
        p.error(f"--data {args.data}: {len(raw)} bytes is too short for windows of {args.block_size}")
    cut = int(len(raw) * 0.9)
    train_data, val_data = raw[:cut], raw[cut:]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = dict(block_size=args.block_size, vocab_size=256, n_layer=args.n_layer, n_head=4, n_embd=args.n_embd)

    # 1. search: every site mixes the candidates; autoln trains the weights and the alphas bilevel
    torch.manual_seed(0)
    supernet = GPT(GPTConfig(**base, norm_candidates=CANDIDATES))
    half = len(train_data) // 2  # DARTS' split: weights on one half, alphas on the other
    outcome = autoln.search(supernet, batches(train_data[:half], args.block_size, args.batch_size, 1), steps=args.search_steps,
                            arch_batches=batches(train_data[half:], args.block_size, args.batch_size, 2))
    genotype = outcome.genotype
    genotype.save(out / "genotype.json")
    print(f"genotype: {genotype.describe()}  ({out / 'genotype.json'})")

    # 2. the derived model, from scratch, with this script's own training loop
    results = {}
    for name, derive in (("derived", True), ("pre-ln (nanoGPT)", False)):
        torch.manual_seed(0)
        model = GPT(GPTConfig(**base, norm_candidates=CANDIDATES if derive else ("pre",)))
        if derive:
            autoln.derive(model, genotype)
        train(model, train_data, model.config, args.retrain_steps, args.batch_size, args.lr, seed=3)
        results[name] = valid_loss(model, val_data, args.block_size)
        if derive:
            torch.save(model.state_dict(), out / "derived.pt")
    for name, loss in results.items():
        print(f"{name}: valid {loss:.4f} nats/byte ({loss / math.log(2):.4f} bits/byte)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
