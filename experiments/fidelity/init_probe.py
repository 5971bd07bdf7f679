"""How strongly does each model start amplify its first update? (docs/search.md, *A fair start*)

For the supernet and every named baseline at 6 blocks (the default) and 24 blocks of width 64
(``experiments/common/validate.py``'s ``deep``), under each ``model.residual_init`` (``unscaled``:
plain xavier; ``scaled``: GPT-2's ``1/sqrt(2N)`` on the branch output projections), it prints
Admin's output change (:func:`autoln.models.diagnostics.output_change`, Liu et al. 2020): the relative
change of the final hidden state after one first Adam-like step ``lr * sign(grad)`` at the
first warm-up step's learning rate (``retrain.lr / retrain.warmup_steps``, 4e-5 at the
defaults), on a fixed batch of training windows, mean over ``--seeds`` initialisations. Forward
and backward passes at initialisation only: about a minute on 2 CPU cores.

    python experiments/fidelity/init_probe.py [--data CORPUS] [--seeds 3] [--windows 8]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for experiments.*
from experiments.common.validate import SETTINGS  # noqa: E402

from autoln.cli import OneLineParser, guarded  # noqa: E402
from autoln.config import load_config  # noqa: E402


def probe(cfg, corpus, names: list[str], seeds: int, windows: int) -> dict[str, float]:
    """Mean output change over ``seeds`` initialisations for each of ``names`` (``supernet`` or
    a named baseline) at ``cfg.model``'s size, on ``windows`` fixed training windows."""
    import numpy as np
    import torch

    from autoln.data import eval_starts, windows as cut
    from autoln.models.diagnostics import output_change
    from autoln.models.genotype import baseline
    from autoln.models.model import build_derived
    from autoln.models.supernet import Supernet

    mc = cfg.model
    train = corpus.splits["train"]
    x, y = cut(train, eval_starts(len(train), mc.context, windows), mc.context)
    lr = cfg.retrain.lr / max(1, cfg.retrain.warmup_steps)
    out = {}
    for name in names:
        vals = []
        for seed in range(seeds):
            torch.manual_seed(seed)
            if name == "supernet":
                model = Supernet(mc, corpus.vocab_size)
            else:
                model = build_derived(mc, corpus.vocab_size, baseline(name, mc, corpus.vocab_size).block_placements())
            model.init_output_bias(corpus.unigram_log_probs())
            vals.append(output_change(model, x, y, lr))
        out[name] = float(np.mean(vals))
    return out


def main(argv=None) -> int:
    p = OneLineParser(prog="init_probe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=None, help="data.corpus (default: the config's)")
    p.add_argument("--config", metavar="FILE")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--windows", type=int, default=8)
    args = p.parse_args(argv)

    def body() -> None:
        from autoln.data import load_corpus
        from autoln.core.errors import ConfigError
        from autoln.models.genotype import BASELINES

        if args.seeds < 1 or args.windows < 1:
            raise ConfigError("--seeds and --windows must be positive integers")
        base = [f"data.corpus={args.data}"] if args.data else []
        corpus = load_corpus(load_config(args.config, base).data)
        names = ["supernet", *BASELINES]
        print(f"Output change after one first step (relative, mean of {args.seeds} seeds); data {corpus.name}\n")
        print("| setting | residual_init | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names))
        for setting in ("shallow", "deep"):
            for init in ("unscaled", "scaled"):
                cfg = load_config(args.config, [*base, *SETTINGS[setting], f"model.residual_init={init}"])
                vals = probe(cfg, corpus, names, args.seeds, args.windows)
                print(f"| {setting} ({cfg.model.n_layers} blocks) | {init} | " + " | ".join(f"{vals[n]:.3f}" for n in names) + " |",
                      flush=True)

    return guarded(body)


if __name__ == "__main__":
    sys.exit(main())
