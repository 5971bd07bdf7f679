"""An independent check of a placement's number in nanoGPT's model: Karpathy's ``model.py``
unchanged (``examples/nanogpt/model.py``, no autoln code in it), its blocks' ``forward`` replaced
by the textbook formula of the placement, trained by the same loop and recipe as
``experiments/truth/own_model_truth.py`` (``examples/nanogpt_recipe.py``: nanoGPT's AdamW groups,
warm-up and cosine, clipping; 4 layers of width 64, block 64, batch 32, 500 steps,
``bias=False``, tiny Shakespeare as characters) at a peak learning rate of choice.

When a named placement trains badly in the QK-norm grid (``experiments/truth/qk_norm.py``:
``all-post`` at lr 1e-2 ends near the unigram level), this says whether the number is autoln's
(its ``Site``, its derived model) or the placement's: the same placement written here from its
formula should land within a few seeds' spread of the table's value.

Placements: ``pre`` ``x + F(LN(x))`` (nanoGPT's own block), ``post`` ``LN(x + F(x))`` (Vaswani et
al. 2017); with ``--qk`` the attention also normalises q and k per head before their dot product
(a LayerNorm of the head size without bias, Dehghani et al. 2023), written here by hand.

    OMP_NUM_THREADS=1 python experiments/truth/plain_nanogpt.py --data input.txt \\
        --placements post,pre --lrs 1e-3,1e-2 --seeds 0 [--qk]

Each finished run is a row of ``experiments/plain_nanogpt.csv`` (reused, never re-run); the script
ends with the table beside ``own_model_truth.csv``'s value of the same placement, learning rate
and seed.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))
from nanogpt_recipe import Recipe, load_data, train, val_loss  # noqa: E402

from autoln.core.io import append_csv_row  # noqa: E402
from experiments.common.retrain_table import current_commit  # noqa: E402
from experiments.truth.own_model_truth import SIZE  # noqa: E402
from experiments.truth.own_model_truth import TABLE as TRUTH  # noqa: E402

def _load_nanogpt():
    """Karpathy's ``model.py``, unchanged, as the module ``nanogpt_model``."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("nanogpt_model", ROOT / "examples" / "nanogpt" / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


nanogpt = _load_nanogpt()
TABLE = ROOT / "experiments" / "plain_nanogpt.csv"
FIELDS = ["placement", "qk", "lr", "seed", "steps", "val", "train_s", "commit"]
NAMED = {"pre": "all-pre", "post": "all-post"}


def post_forward(self, x):
    """Post-LN (Vaswani et al. 2017): ``LN(x + F(x))`` for each sublayer."""
    x = self.ln_1(x + self.attn(x))
    return self.ln_2(x + self.mlp(x))


def qk_attention(self, x):
    """nanoGPT's causal self-attention with q and k layer-normed per head (no bias, no gain
    change at the start): ``(B, T, C)`` in and out."""
    B, T, C = x.size()
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    hs = C // self.n_head
    q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
    q, k = self.q_ln(q), self.k_ln(k)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
    return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


def build(placement: str, qk: bool, vocab: int) -> torch.nn.Module:
    """nanoGPT's GPT at :data:`SIZE` with every block in ``placement`` (``pre``: as written)."""
    with contextlib.redirect_stdout(io.StringIO()):
        model = nanogpt.GPT(nanogpt.GPTConfig(**SIZE, vocab_size=vocab, dropout=0.0))
    for block in model.transformer.h:
        if placement == "post":
            block.forward = post_forward.__get__(block)
        if qk:
            hs = SIZE["n_embd"] // SIZE["n_head"]
            block.attn.q_ln, block.attn.k_ln = nanogpt.LayerNorm(hs, bias=False), nanogpt.LayerNorm(hs, bias=False)
            block.attn.forward = qk_attention.__get__(block.attn)
    return model


def done() -> dict[tuple[str, str, str, int], float]:
    """Finished runs: ``(placement, qk, lr, seed) -> val``."""
    if not TABLE.exists():
        return {}
    with open(TABLE, newline="", encoding="utf-8") as f:
        return {(r["placement"], r["qk"], r["lr"], int(r["seed"])): float(r["val"]) for r in csv.DictReader(f)}


def autoln_value(placement: str, qk: bool, lr: float, seed: int) -> str:
    """The QK-norm grid's value of the same model in ``own_model_truth.csv`` (autoln's derived model)."""
    want_qk = "qk" if qk else "none"
    with open(TRUTH, newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            lr_ok = f"lr={lr:g}" in r["setup"] if lr != Recipe().lr else "lr=" not in r["setup"]
            name = r["name"].split(":")[-1].removesuffix("+qk")
            if (name == NAMED[placement] and (r.get("qk") or "none").split(" ")[0] == want_qk and lr_ok
                    and int(r["seed"]) == seed and int(r["steps"]) == Recipe().steps and "warmup-scaled" not in r["setup"]):
                return f"{float(r['val']):.4f}"
    return "-"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="a text file read as characters (tiny Shakespeare's input.txt)")
    p.add_argument("--placements", default="post,pre", help="comma-separated, of: pre, post")
    p.add_argument("--lrs", default="1e-3,1e-2", help="peak learning rates, comma-separated")
    p.add_argument("--seeds", default="0", help="comma-separated seeds")
    p.add_argument("--qk", action="store_true", help="QK-norm per head in every attention, written here by hand")
    args = p.parse_args(argv)
    placements = args.placements.split(",")
    bad = [x for x in placements if x not in NAMED]
    if bad:
        p.error(f"--placements: expected some of {list(NAMED)}, got {bad}")
    try:
        lrs = [float(x) for x in args.lrs.split(",")]
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError as e:
        p.error(f"--lrs/--seeds: expected comma-separated numbers ({e})")
    train_data, val_data, vocab = load_data(args.data)
    commit, have, qk = current_commit(), done(), "qk" if args.qk else "none"
    for lr in lrs:
        for placement in placements:
            for seed in seeds:
                if (placement, qk, f"{lr:g}", seed) in have:
                    continue
                torch.manual_seed(seed)
                model = build(placement, args.qk, vocab)
                recipe = Recipe(lr=lr, min_lr=lr / 10)
                t0 = time.perf_counter()
                train(model, train_data, SIZE["block_size"], recipe, seed)
                val = val_loss(model, val_data, SIZE["block_size"])
                append_csv_row(TABLE, FIELDS, {"placement": placement, "qk": qk, "lr": f"{lr:g}", "seed": seed,
                                               "steps": recipe.steps, "val": f"{val:.6f}",
                                               "train_s": f"{time.perf_counter() - t0:.1f}", "commit": commit})
                have[(placement, qk, f"{lr:g}", seed)] = val
                print(f"[plain] {placement} qk={qk} lr {lr:g} seed {seed}: val {val:.4f}", file=sys.stderr, flush=True)
    print("| placement | QK-norm | lr | seed | plain nanoGPT (nats/char) | autoln's derived model |\n|---|---|---|---|---|---|")
    for (placement, q, lr, seed), val in sorted(have.items()):
        shown = f"{val:.4f}" if math.isfinite(val) else "diverged"
        print(f"| {placement} | {q} | {lr} | {seed} | {shown} | {autoln_value(placement, q == 'qk', float(lr), seed)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
