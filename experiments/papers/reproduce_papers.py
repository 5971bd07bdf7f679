"""Rerun three published layer-norm observations at CPU scale and report what was measured.

(a) Xiong et al. 2020, Fig. 3: at initialisation, Post-LN's per-layer gradient norm (FFN second
    weight) grows toward the output while Pre-LN's stays flat. Measured with
    :func:`autoln.models.diagnostics.grad_norms` on ``--grad-seeds`` initialisations x one batch of
    valid windows, 12 blocks.
(b) Xiong et al. 2020, §3: Post-LN trained with Adam at a high peak learning rate without
    warm-up ends much worse than with warm-up, while Pre-LN is fine without it. Four retrains
    (post/pre x warm-up 0 / ``--warmup``) at ``--lr``, same data order and seed.
(c) Wang et al. 2022 (DeepNet): a deep, narrow stack (``--deep-layers`` blocks) of plain
    Post-LN diverges or stalls where DeepNorm trains. Retrains of all-post, all-deepnorm and
    all-pre at that depth.

Nothing is tuned to force an effect: the settings are fixed below and on the command line,
and the report states whether each observation was reproduced, with the numbers. Runs are
ordinary retrains under ``<out>/<part>/<name>`` (a finished run is reused, so the script can
be re-run); the report is ``<out>/report.md`` with PNGs beside it.

    python experiments/papers/reproduce_papers.py [--config FILE] [--set KEY=VALUE ...] [--out runs/reproduce]
        [--parts a,b,c] [--lr 3e-3] [--warmup 300] [--steps 600] [--deep-layers 24] [--deep-steps 200]

About 9 minutes on 2 CPU cores with the defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from autoln.cli import guarded
from autoln.config import ModelConfig, load_config
from autoln.core.io import save_figure_atomic, write_text_atomic


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def part_a(cfg, out: Path, seeds: int) -> tuple[str, dict]:
    """Per-layer FFN fc2 / attention out-proj gradient norms at init, Post-LN vs Pre-LN."""
    import torch

    from autoln.data import eval_batches, eval_starts, load_corpus
    from autoln.models.diagnostics import grad_norms
    from autoln.models.model import build_derived

    corpus = load_corpus(cfg.data)
    mc = dataclasses.replace(cfg.model, n_layers=12)
    valid = corpus.splits["valid"]
    x, y = next(eval_batches(valid, eval_starts(len(valid), mc.context, 16), mc.context, 16))
    result = {}
    for placement in ("post", "pre"):
        runs = []
        for seed in range(seeds):
            torch.manual_seed(seed)
            model = build_derived(mc, corpus.vocab_size, [(placement, placement)] * mc.n_layers).init_output_bias(corpus.unigram_log_probs())
            runs.append(grad_norms(model, x, y)["ffn_out"])
        result[placement] = [statistics.mean(r[i] for r in runs) for i in range(mc.n_layers)]
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, ys in result.items():
        ax.plot(range(1, len(ys) + 1), ys, marker="o", ms=3, label=f"{name}-LN")
    ax.set(xlabel="block", ylabel="||grad W_fc2|| at init", title=f"(a) gradient norm at init, mean of {seeds} seeds")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure_atomic(fig, out / "a_grad_norms.png")
    plt.close(fig)
    ratio = {k: v[-1] / v[0] for k, v in result.items()}
    spread = {k: max(v) / min(v) for k, v in result.items()}
    grows = ratio["post"] > 1.5 and result["post"][-1] == max(result["post"])
    flat = spread["pre"] < spread["post"]
    verdict = "reproduced" if grows and flat else "not reproduced"
    table = "| block | " + " | ".join(str(i + 1) for i in range(12)) + " |\n|---|" + "---|" * 12 + "\n"
    for k, v in result.items():
        table += f"| {k}-LN | " + " | ".join(f"{g:.3g}" for g in v) + " |\n"
    text = (f"### (a) Gradient norm at initialisation (Xiong et al. 2020, Fig. 3): {verdict}\n\n"
            f"12 blocks of width {mc.d_model}, FFN second weight, mean over {seeds} initialisations on 16 valid windows.\n\n"
            f"{table}\nlast/first block: Post-LN {ratio['post']:.2f}, Pre-LN {ratio['pre']:.2f}; "
            f"max/min over blocks: Post-LN {spread['post']:.2f}, Pre-LN {spread['pre']:.2f}. ![](a_grad_norms.png)\n")
    return text, {"grad_norm_ffn_out": result, "last_over_first": ratio, "max_over_min": spread, "verdict": verdict}


def _retrain(cfg, spec: str, run_dir: Path) -> dict:
    """One retrain (reused when finished, continued when interrupted); returns metrics.json's content, or a dict with
    ``diverged`` and the message."""
    from autoln.retrain.run_retrain import retrain_reusing
    from autoln.core.errors import DivergenceError

    if (run_dir / "diverged.txt").exists():
        return {"diverged": (run_dir / "diverged.txt").read_text().strip()}
    try:
        return retrain_reusing(cfg, spec, run_dir)
    except DivergenceError as exc:
        write_text_atomic(run_dir / "diverged.txt", f"{exc}\n")
        return {"diverged": str(exc)}


def _curves(runs: dict[str, dict], headline: str, path: Path, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for name, m in runs.items():
        if "history" in m:
            ax.plot([h["step"] for h in m["history"]], [h[headline] for h in m["history"]], marker="o", ms=2, label=name)
    ax.set(xlabel="step", ylabel=f"valid {headline}", title=title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure_atomic(fig, path)
    plt.close(fig)


def _valid(m: dict, headline: str) -> float:
    """The final valid metric of a run, inf when it diverged."""
    return float("inf") if "diverged" in m else m["valid"][headline]


def _final(m: dict, headline: str) -> str:
    return "diverged" if "diverged" in m else f"{m['valid'][headline]:.4f}"


def part_b(cfg, out: Path, lr: float, warmup: int, steps: int) -> tuple[str, dict]:
    """Post-LN and Pre-LN at peak ``lr`` with and without ``warmup`` warm-up steps."""
    from autoln.data import HEADLINE

    headline = HEADLINE[cfg.data.tokenizer]
    runs = {}
    for placement in ("post", "pre"):
        for w in (0, warmup):
            rc = dataclasses.replace(cfg.retrain, lr=lr, warmup_steps=w, steps=steps, eval_every=max(1, steps // 6))
            runs[f"{placement}-LN warm-up {w}"] = _retrain(dataclasses.replace(cfg, retrain=rc), f"all-{placement}",
                                                           out / "b" / f"{placement}-warmup{w}")
    _curves(runs, headline, out / "b_warmup.png", f"(b) peak lr {lr}, Adam, with / without warm-up")

    post_gap = _valid(runs["post-LN warm-up 0"], headline) - _valid(runs[f"post-LN warm-up {warmup}"], headline)
    pre_gap = _valid(runs["pre-LN warm-up 0"], headline) - _valid(runs[f"pre-LN warm-up {warmup}"], headline)
    verdict = "reproduced" if post_gap > 0.05 and post_gap > 2 * max(pre_gap, 0.0) else "not reproduced"
    rows = "\n".join(f"| {n} | {_final(m, headline)} | {m.get('diagnostics', {}).get('loss_spikes', '-')} |" for n, m in runs.items())
    text = (f"### (b) Warm-up with Adam at a high peak learning rate (Xiong et al. 2020, §3): {verdict}\n\n"
            f"{cfg.model.n_layers} blocks of width {cfg.model.d_model}, peak lr {lr}, {steps} steps "
            f"({cfg.retrain.schedule} after warm-up), same seed and batches.\n\n| run | final valid {headline} | loss spikes |\n|---|---|---|\n{rows}\n\n"
            f"Cost of no warm-up (valid, no warm-up minus warm-up): Post-LN {post_gap:+.4f}, Pre-LN {pre_gap:+.4f}. ![](b_warmup.png)\n")
    return text, {"final": {n: _final(m, headline) for n, m in runs.items()}, "post_gap": post_gap, "pre_gap": pre_gap,
                  "verdict": verdict}


def part_c(cfg, out: Path, layers: int, steps: int) -> tuple[str, dict]:
    """all-post vs all-deepnorm (and all-pre) at ``layers`` blocks of width 64."""
    from autoln.data import HEADLINE

    headline = HEADLINE[cfg.data.tokenizer]
    mc = ModelConfig(n_layers=layers, d_model=64, n_heads=2, d_ff=256, context=64, norm=cfg.model.norm)
    rc = dataclasses.replace(cfg.retrain, steps=steps, eval_every=max(1, steps // 8), batch_size=16)
    deep = dataclasses.replace(cfg, model=mc, retrain=rc)
    runs = {name: _retrain(deep, name, out / "c" / name) for name in ("all-post", "all-deepnorm", "all-pre")}
    _curves(runs, headline, out / "c_deep.png", f"(c) {layers} blocks of width 64")
    post_v, dn_v = _valid(runs["all-post"], headline), _valid(runs["all-deepnorm"], headline)
    verdict = "reproduced" if dn_v < post_v - 0.05 else "not reproduced"
    rows = "\n".join(f"| {n} | {_final(m, headline)} | {m.get('diagnostics', {}).get('loss_spikes', '-')} | "
                     f"{_max_update(m)} |" for n, m in runs.items())
    text = (f"### (c) Deep, narrow stack (Wang et al. 2022): {verdict}\n\n{layers} blocks of width 64 "
            f"(context 64, batch 16), lr {rc.lr}, warm-up {rc.warmup_steps}, {steps} steps, same seed and batches.\n\n"
            f"| genotype | final valid {headline} | loss spikes | largest update size at an evaluation |\n|---|---|---|---|\n{rows}\n\n![](c_deep.png)\n")
    return text, {"final": {n: _final(m, headline) for n, m in runs.items()}, "verdict": verdict}


def _max_update(m: dict) -> str:
    evals = m.get("diagnostics", {}).get("evaluations", [])
    return f"{max(e['update_size'] for e in evals):.3g}" if evals else "-"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", metavar="FILE")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", default="runs/reproduce")
    p.add_argument("--parts", default="a,b,c")
    p.add_argument("--grad-seeds", type=int, default=5)
    p.add_argument("--lr", type=float, default=3e-3, help="(b) peak learning rate")
    p.add_argument("--warmup", type=int, default=300, help="(b) warm-up steps of the warm-up runs")
    p.add_argument("--steps", type=int, default=600, help="(b) training steps")
    p.add_argument("--deep-layers", type=int, default=24, help="(c) depth")
    p.add_argument("--deep-steps", type=int, default=200, help="(c) training steps")
    args = p.parse_args(argv)

    def body() -> None:
        cfg = load_config(args.config, [*args.overrides, "logging.progress=false"])
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        parts, sections, numbers = args.parts.split(","), [], {}
        if "a" in parts:
            text, numbers["a"] = part_a(cfg, out, args.grad_seeds)
            sections.append(text)
        if "b" in parts:
            text, numbers["b"] = part_b(cfg, out, args.lr, args.warmup, args.steps)
            sections.append(text)
        if "c" in parts:
            text, numbers["c"] = part_c(cfg, out, args.deep_layers, args.deep_steps)
            sections.append(text)
        report = (f"# Reproductions at CPU scale\n\nData: {cfg.data.corpus} ({cfg.data.tokenizer}). Command: "
                  f"`python experiments/papers/reproduce_papers.py {' '.join(argv or sys.argv[1:])}`\n\n" + "\n".join(sections))
        write_text_atomic(out / "report.md", report)
        write_text_atomic(out / "report.json", json.dumps(numbers, indent=2) + "\n")
        print(report)

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
