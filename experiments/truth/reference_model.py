"""An independent minimal model: is a placement's poor number autoln's, or the placement's?

When a named baseline loses badly (``all-none`` and ``all-outnorm`` in docs/results.md), this
script trains the same placement in a small GPT written here from scratch, in the style of
nanoGPT's model.py, sharing no model, placement, init or training code with autoln (only the
corpus reader, so that both see the same bytes, and the evaluation windows' positions). Same
size, same start (docs/search.md, *A fair start for every placement*: embeddings ``N(0, 0.02)``, every linear
``xavier_normal_``, the branch output projections times GPT-2's ``1/sqrt(2N)`` with
``--start scaled`` or not with ``unscaled``, a tied LM head with its bias at the training split's
unigram log-probabilities), same recipe as ``retrain.py``'s defaults (AdamW, lr 2e-3, betas
(0.9, 0.95), weight decay 0.1 on matrices, 50 warm-up steps, cosine to a tenth, clip 1.0,
batch 16, context 128, 1000 steps; :data:`RECIPE`, checked against autoln's defaults by
tests/test_reference_model.py) and the same 512 valid windows. Its initial weights and batches
are its own draws, so expect the same ordering and size of effect, within a few seeds' spread,
not equal numbers.

Placements (per sublayer): ``pre`` ``x + F(LN(x))``, ``post`` ``LN(x + F(x))``,
``outnorm`` ``x + LN(F(x))``, ``none`` ``x + F(x)``; every model ends with a final LN. ``--placement``
takes one for every block, or one per block, comma-separated (``pre,pre,pre,post,post,post`` is
``pre-post`` at 6 blocks). ``--lr`` and ``--warmup-steps`` replace the recipe's two values, for
``experiments/common/validate.py``'s ``highlr`` setting (lr 3e-3, no warm-up).

    python experiments/truth/reference_model.py --data WIKITEXT_FOLDER --placement none [--start scaled]
        [--layers 6 --d-model 96 --heads 4 --d-ff 384] [--lr 2e-3 --warmup-steps 50] [--seed 0]
        [--out runs/reference]

Writes ``<out>/<placements>-<start>-L<layers>[-lr<lr>-w<warmup>]-s<seed>.json`` (valid bits per
byte every 100 steps and at the end; per-block placements run-length coded, ``pre3.post3``; the
lr part only away from the recipe's) atomically; a finished file is reused (a damaged one is
redone), so a list of runs can be re-run.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

PLACEMENTS = ("pre", "post", "outnorm", "none")
#: The training recipe: ``retrain.py``'s defaults (autoln.config.RetrainConfig, ModelConfig.context).
RECIPE = {"steps": 1000, "batch_size": 16, "context": 128, "lr": 2e-3, "betas": (0.9, 0.95), "weight_decay": 0.1,
          "warmup_steps": 50, "min_lr_ratio": 0.1, "grad_clip": 1.0, "eval_windows": 64, "final_eval_windows": 512}
#: What a record must match to be reused (with the corpus' fingerprint).
SETTINGS = ("placement", "start", "layers", "d_model", "heads", "d_ff", "seed", "lr", "warmup_steps")
STARTS = ("scaled", "unscaled")


class Branch(nn.Module):
    """Causal self-attention (``kind="attn"``) or a GELU MLP (``"mlp"``), no biases,
    ``(B, T, d)`` in and out; ``proj`` is the matrix that writes into the residual stream."""

    def __init__(self, kind: str, d: int, heads: int, d_ff: int) -> None:
        super().__init__()
        self.kind, self.heads = kind, heads
        if kind == "attn":
            self.qkv = nn.Linear(d, 3 * d, bias=False)
            self.proj = nn.Linear(d, d, bias=False)
        else:
            self.fc = nn.Linear(d, d_ff, bias=False)
            self.proj = nn.Linear(d_ff, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "mlp":
            return self.proj(F.gelu(self.fc(x)))
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Sublayer(nn.Module):
    """One branch with its norm placed as ``placement`` says."""

    def __init__(self, placement: str, branch: Branch, d: int) -> None:
        super().__init__()
        self.placement, self.branch = placement, branch
        self.ln = nn.LayerNorm(d) if placement != "none" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p, f, ln = self.placement, self.branch, self.ln
        if p == "pre":
            return x + f(ln(x))
        if p == "post":
            return ln(x + f(x))
        if p == "outnorm":
            return x + ln(f(x))
        return x + f(x)


class GPT(nn.Module):
    """Token + position embeddings, ``layers`` blocks of (attention, MLP) sublayers, a final LN,
    an LM head tied to the token embedding with a bias. ``(B, T)`` ids -> ``(B, T, vocab)`` logits.
    ``placement``: one for every block, as a string or a list of one, or a list of one per block.
    Raises ValueError for a list of another length."""

    def __init__(self, vocab: int, context: int, layers: int, d: int, heads: int, d_ff: int, placement: str | list[str],
                 start: str, unigram: np.ndarray) -> None:
        super().__init__()
        per_block = [placement] if isinstance(placement, str) else list(placement)
        per_block = per_block * layers if len(per_block) == 1 else per_block
        if len(per_block) != layers:
            raise ValueError(f"placement: expected 1 or {layers} placements, got {len(per_block)}")
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(
            nn.Sequential(Sublayer(p, Branch("attn", d, heads, d_ff), d), Sublayer(p, Branch("mlp", d, heads, d_ff), d))
            for p in per_block)
        self.ln_f = nn.LayerNorm(d)
        self.bias = nn.Parameter(torch.tensor(unigram, dtype=torch.float32))
        with torch.no_grad():
            nn.init.normal_(self.wte.weight, std=0.02)
            nn.init.normal_(self.wpe.weight, std=0.02)
            for block in self.blocks:
                for sub in block:
                    if sub.branch.kind == "attn":  # xavier per q, k, v matrix, as separate d x d projections
                        for w in sub.branch.qkv.weight.split(d, dim=0):
                            nn.init.xavier_normal_(w)
                    else:
                        nn.init.xavier_normal_(sub.branch.fc.weight)
                    nn.init.xavier_normal_(sub.branch.proj.weight)
                    if start == "scaled":
                        sub.branch.proj.weight.mul_((2 * layers) ** -0.5)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight, self.bias)


def valid_bpb(model: GPT, tokens: np.ndarray, starts: np.ndarray, context: int) -> float:
    """Mean cross-entropy over the windows at ``starts`` (``context + 1`` tokens each), in bits per
    byte (byte tokens: nats / ln 2)."""
    from autoln.data import eval_batches

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in eval_batches(tokens, starts, context, 64):
            logits = model(x)
            total += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
            count += y.numel()
    model.train()
    return total / count / math.log(2)


def lr_factor(step: int, warmup: int = RECIPE["warmup_steps"]) -> float:
    """Learning-rate multiplier at 0-based step ``step``: linear warm-up over ``warmup`` steps (none
    when 0), then cosine from 1 to ``min_lr_ratio`` at ``steps`` (Loshchilov & Hutter 2017)."""
    steps, floor = RECIPE["steps"], RECIPE["min_lr_ratio"]
    if step < warmup:
        return (step + 1) / warmup
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (steps - warmup))))


def train(args, corpus) -> dict:
    """One run; returns its results (valid bits per byte every 100 steps and at the end)."""
    from autoln.data import eval_starts, windows

    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    train_tokens, valid = corpus.splits["train"], corpus.splits["valid"]
    r, context = RECIPE, RECIPE["context"]
    model = GPT(corpus.vocab_size, context, args.layers, args.d_model, args.heads, args.d_ff, args.placement,
                args.start, corpus.unigram_log_probs())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": r["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
                            lr=args.lr, betas=r["betas"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, args.warmup_steps))
    curve_starts = eval_starts(len(valid), context, r["eval_windows"])
    final_starts = eval_starts(len(valid), context, r["final_eval_windows"])
    history, began, steps = [], time.time(), r["steps"]
    for step in range(steps):
        x, y = windows(train_tokens, rng.integers(0, len(train_tokens) - context, size=r["batch_size"]), context)
        loss = F.cross_entropy(model(x).reshape(-1, model.wte.num_embeddings), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["grad_clip"])
        opt.step()
        sched.step()
        if (step + 1) % 100 == 0:
            history.append({"step": step + 1, "bits_per_byte": valid_bpb(model, valid, curve_starts, context)})
            print(f"{','.join(args.placement)} {args.start} L{args.layers} lr {args.lr:g} seed {args.seed}: step {step + 1} valid {history[-1]['bits_per_byte']:.3f} bpb", flush=True)
    return {"steps": steps, "parameters": sum(p.numel() for p in model.parameters()),
            "valid_bits_per_byte": valid_bpb(model, valid, final_starts, context), "history": history,
            "wall_time_s": round(time.time() - began, 1)}


def placements_arg(text: str) -> list[str]:
    """``--placement``: one of :data:`PLACEMENTS`, or one per block, comma-separated; returned as
    the list of names (one, or one per block). Raises argparse.ArgumentTypeError naming the unknown one."""
    import argparse

    names = text.split(",")
    bad = [p for p in names if p not in PLACEMENTS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown placement {bad[0]!r}: expected one of {', '.join(PLACEMENTS)}, "
                                         "or one per block, comma-separated")
    return names


def run_name(args) -> str:
    """The record's file name: ``<placements>-<start>-L<layers>[-lr<lr>-w<warmup>]-s<seed>.json``,
    per-block placements run-length coded (``pre3.post3``), the lr part only away from the recipe."""
    from itertools import groupby

    runs = [(p, len(list(g))) for p, g in groupby(args.placement)]
    tag = runs[0][0] if len(runs) == 1 else ".".join(f"{p}{n}" for p, n in runs)
    recipe = "" if (args.lr, args.warmup_steps) == (RECIPE["lr"], RECIPE["warmup_steps"]) else f"-lr{args.lr:g}-w{args.warmup_steps}"
    return f"{tag}-{args.start}-L{args.layers}{recipe}-s{args.seed}.json"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
    from experiments.common.validate import positive_int

    from autoln.cli import OneLineParser, guarded
    from autoln.config import load_config
    from autoln.data import load_corpus
    from autoln.core.errors import ConfigError
    from autoln.core.io import read_json, write_json_atomic

    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="the corpus (data.corpus), e.g. the WikiText-2 folder")
    p.add_argument("--placement", type=placements_arg, required=True,
                   help=f"one of {', '.join(PLACEMENTS)} for every block, or one per block, comma-separated")
    p.add_argument("--start", choices=STARTS, default="scaled")
    p.add_argument("--layers", type=positive_int, default=6)
    p.add_argument("--d-model", type=positive_int, default=96)
    p.add_argument("--heads", type=positive_int, default=4)
    p.add_argument("--d-ff", type=positive_int, default=384)
    p.add_argument("--lr", type=float, default=RECIPE["lr"], help=f"peak learning rate (default {RECIPE['lr']:g})")
    p.add_argument("--warmup-steps", type=int, default=RECIPE["warmup_steps"],
                   help=f"linear warm-up steps, 0 for none (default {RECIPE['warmup_steps']})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/reference")
    args = p.parse_args(argv)
    if args.d_model % args.heads:
        p.error(f"--d-model {args.d_model} must be a multiple of --heads {args.heads}")
    if len(args.placement) not in (1, args.layers):
        p.error(f"--placement: expected one placement or {args.layers} (one per block), got {len(args.placement)}")
    if not (args.lr > 0 and math.isfinite(args.lr)):
        p.error(f"--lr: expected a positive number, got {args.lr}")
    if not 0 <= args.warmup_steps < RECIPE["steps"]:
        p.error(f"--warmup-steps: expected 0 to {RECIPE['steps'] - 1}, got {args.warmup_steps}")
    if args.seed < 0:
        p.error(f"--seed: expected a non-negative integer, got {args.seed}")

    def run() -> int:
        out = Path(args.out) / run_name(args)
        corpus = load_corpus(load_config(None, [f"data.corpus={args.data}"]).data)
        if corpus.tokenizer != "bytes":
            raise ConfigError(f"--data {args.data}: the reference model reports bits per byte of byte tokens, "
                              f"but this corpus reads as {corpus.tokenizer!r} tokens")
        # the record keeps --placement as given ("pre", "pre,post,..."), as records made before did
        settings = {k: getattr(args, k) for k in SETTINGS} | {"placement": ",".join(args.placement),
                                                               "data_fingerprint": corpus.fingerprint}
        record = read_json(out)
        if isinstance(record, dict) and isinstance(record.get("valid_bits_per_byte"), float):
            other = [f"{k} {record.get(k, RECIPE.get(k))!r}, not {v!r}" for k, v in settings.items()
                     if record.get(k, RECIPE.get(k)) != v]  # records older than --lr/--warmup-steps had the recipe's
            if other:
                raise ConfigError(f"{out} holds a run of other settings ({'; '.join(other)}): choose another --out")
            print(f"{out}: reused, valid {record['valid_bits_per_byte']:.3f} bits per byte")
            return 0
        if out.exists():
            print(f"{out}: not a finished run's record; training again")
        record = settings | train(args, corpus)
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, record)
        print(f"{out}: valid {record['valid_bits_per_byte']:.3f} bits per byte ({record['parameters']} parameters)")
        return 0

    return guarded(run)


if __name__ == "__main__":
    sys.exit(main())
