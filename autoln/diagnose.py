"""``python -m autoln.diagnose --genotype FILE_OR_NAME [--config FILE] [--set KEY=VALUE ...] [--steps N] [--out DIR]``

The diagnostics of :mod:`autoln.models.diagnostics` for one derived model: at initialisation the
per-block gradient norms (attention out-projection, FFN second weight), residual-stream norms
and angular distances, on a fixed batch of valid windows; then the model update size
``||f(x; theta_t) - f(x; theta_0)||`` and the loss spikes over the first ``--steps`` training
steps (the retrain's optimiser, schedule, seed and data order). Prints a table per diagnostic,
saves one PNG each, logs them to TensorBoard and writes ``diagnostics.json`` in ``--out``.

Exit status as ``retrain.py``: 0 done, 2 bad input, 3 diverged, 130 interrupted.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional, Sequence

#: Steps at which the update size is printed (those up to ``--steps``, and the last).
PRINT_STEPS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def _figure(xs, series: dict[str, list[float]], xlabel: str, ylabel: str, title: str, log_y: bool = False):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, ys in series.items():
        ax.plot(xs[:len(ys)], ys, marker="o" if len(ys) <= 50 else None, ms=3, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if log_y:
        ax.set_yscale("log")
    if len(series) > 1:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def run_diagnose(cfg, genotype_spec: str, out: str | Path, steps: int, overwrite: bool = False) -> dict:
    """Compute, print and save the diagnostics of ``genotype_spec``'s derived model.

    Returns the content of ``diagnostics.json``.

    Raises:
        ConfigError: ``steps`` is not positive. OutputError, DataError, GenotypeError as
        ``retrain.py``. DivergenceError: the loss became NaN/inf (the diagnostics up to that
        step are written first).
    """
    import matplotlib.pyplot as plt
    import numpy as np

    from autoln.data import WindowSampler, eval_batches, eval_starts
    from autoln.models.diagnostics import SpikeCounter, logits, snapshot
    from autoln.core.errors import ConfigError
    from autoln.core.io import save_figure_atomic, write_json_atomic
    from autoln.models.model import build_derived
    from autoln.retrain.run_retrain import DIAG_WINDOWS, log_diagnostics, prepare_derived
    from autoln.core.errors import DivergenceError
    from autoln.core.tb import Logger
    from autoln.engine.training import prepare_model, prepare_out_dir, seed_everything, train_step, weight_optimizer

    if steps < 1:
        raise ConfigError(f"--steps must be a positive integer, got {steps}")
    rc = cfg.retrain
    device, corpus, genotype, cfg = prepare_derived(cfg, genotype_spec, out, overwrite)
    mc = cfg.model
    seed_everything(rc.seed)
    derived = build_derived(mc, corpus.vocab_size, genotype.block_placements(), genotype.qk_choices()).init_output_bias(corpus.unigram_log_probs())
    model = prepare_model(derived, device, rc)
    opt, sched = weight_optimizer(list(model.named_parameters()), rc)
    train, valid = corpus.splits["train"], corpus.splits["valid"]
    sampler = WindowSampler(train, np.array([[0, len(train)]]), mc.context, rc.batch_size, seed=[rc.seed, 3])
    x, y = next(eval_batches(valid, eval_starts(len(valid), mc.context, DIAG_WINDOWS), mc.context, DIAG_WINDOWS))
    x, y = x.to(device), y.to(device)
    reference = logits(model, x)
    init = snapshot(model, x, y)

    out = prepare_out_dir(out, overwrite)
    log = Logger(out, cfg.logging.tensorboard)
    log_diagnostics(log, init, 0)
    spikes = SpikeCounter(factor=rc.spike_factor)
    losses, updates, diverged = [], [], None
    for step in range(1, steps + 1):
        xb, yb = sampler.sample()
        loss, _ = train_step(model, opt, sched, xb.to(device), yb.to(device), rc.grad_clip)
        spikes.update(loss)
        losses.append(loss)
        if not math.isfinite(loss):
            diverged = step
            break
        updates.append(snapshot(model, x, reference=reference)["update_size"])
        log.scalar("diag/update_size", updates[-1], step)
        log.scalar("train/loss", loss, step)
    log.scalar("diag/loss_spikes", spikes.spikes, len(losses))

    name = genotype_spec if len(genotype_spec) < 40 else Path(genotype_spec).name
    blocks = list(range(mc.n_layers))
    figures = {
        "grad_norms": _figure(blocks, {"attn out-proj": init["grad_norm_attn_out"], "FFN fc2": init["grad_norm_ffn_out"]},
                              "block", "gradient norm at init", f"{name}: per-block gradient norm at initialisation"),
        "residual_norms": _figure(list(range(mc.n_layers + 1)), {"residual stream": init["residual_norm"]},
                                  "after block (0 = embedding)", "mean L2 norm", f"{name}: residual-stream norm at init"),
        "angular_distance": _figure(blocks, {"arccos(cos(in, out)) / pi": init["angular_distance"]},
                                    "block", "angular distance", f"{name}: block input vs output at init"),
        "update_size": _figure(list(range(1, len(updates) + 1)), {"||f(x; theta_t) - f(x; theta_0)||": updates},
                               "step", "mean L2 over tokens (logits)", f"{name}: model update size", log_y=bool(updates)),
    }
    files = []
    for key, fig in figures.items():
        files.append(str(save_figure_atomic(fig, out / f"{key}.png")))
        log.figure(f"diagnose/{key}", fig, 0)
        plt.close(fig)
    log.close()

    result = {"genotype": genotype_spec, "placements": genotype.describe(), "batch_windows": int(x.shape[0]),
              "init": init, "update_size": updates, "loss": [v if math.isfinite(v) else None for v in losses],
              "loss_spikes": spikes.spikes, "spike_factor": rc.spike_factor, "diverged_at": diverged, "figures": files}
    write_json_atomic(out / "diagnostics.json", result)

    print(f"diagnostics of {genotype.describe()} ({genotype_spec}), {x.shape[0]} valid windows of {mc.context} tokens")
    print("\n| block | grad norm attn out | grad norm FFN fc2 | residual norm after | angular distance (arccos/pi) |\n|---|---|---|---|---|")
    for i in blocks:
        print(f"| {i} | {init['grad_norm_attn_out'][i]:.4g} | {init['grad_norm_ffn_out'][i]:.4g} | "
              f"{init['residual_norm'][i + 1]:.4g} | {init['angular_distance'][i]:.4f} |")
    print(f"\nembedding residual norm {init['residual_norm'][0]:.4g}")
    print("\n| step | update size (L2 norm of the logits' change) | train loss (nats/token) |\n|---|---|---|")
    for s in sorted({p for p in PRINT_STEPS if p <= len(updates)} | ({len(updates)} if updates else set())):
        print(f"| {s} | {updates[s - 1]:.4g} | {losses[s - 1]:.4f} |")
    print(f"\nloss spikes (loss > {rc.spike_factor} x running mean): {spikes.spikes} in {len(losses)} steps")
    print(f"wrote {out / 'diagnostics.json'} and {len(files)} PNGs in {out}")
    if diverged:
        raise DivergenceError(f"the loss became {losses[-1]} at step {diverged}; the diagnostics up to it are in {out}")
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``python -m autoln.diagnose``; returns the exit status."""
    from autoln.cli import OneLineParser, guarded

    p = OneLineParser(prog="python -m autoln.diagnose", description=__doc__.split("\n\n")[1])
    p.add_argument("--genotype", required=True, metavar="FILE_OR_NAME",
                   help="genotype.json, or all-pre | all-post | all-deepnorm | mix-ln | pre-post")
    p.add_argument("--config", metavar="FILE", help="YAML config (the retrain section sets optimiser and seed)")
    p.add_argument("--set", dest="overrides", metavar="KEY=VALUE", action="append", default=[])
    p.add_argument("--steps", type=int, default=100, help="training steps over which the update size is tracked (default 100)")
    p.add_argument("--out", metavar="DIR", help="output folder (default runs/diagnose-<name>-<UTC time>Z)")
    p.add_argument("--overwrite", action="store_true", help="reuse an --out folder that holds a finished run")
    args = p.parse_args(argv)

    def body() -> None:
        from autoln.config import load_config
        from autoln.models.genotype import is_baseline
        from autoln.engine.training import default_out_dir

        cfg = load_config(args.config, args.overrides)
        tag = args.genotype if is_baseline(args.genotype) else ""
        run_diagnose(cfg, args.genotype, args.out or default_out_dir("diagnose", tag), args.steps, args.overwrite)

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
