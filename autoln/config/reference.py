"""The configuration reference (docs/configuration.md), generated from the config dataclasses.

Every key of :class:`autoln.config.Config` with its built-in default and its meaning
(:data:`HELP`); a test fails when a key has no entry or the committed file differs from
:func:`reference_markdown`, so the reference cannot drift. Regenerate it with
``python -m autoln.config.reference --write docs/configuration.md``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from autoln.config.runs import Config

#: Meanings of the keys shared by ``search`` and ``retrain`` (:class:`autoln.config.TrainConfig`).
TRAIN_HELP = {
    "steps": "optimizer steps (the search: bilevel iterations, one alpha step and one weight step each)",
    "batch_size": "windows per step, the global batch (split over the processes under torchrun)",
    "lr": "peak learning rate of the weights (AdamW)",
    "min_lr_ratio": "the cosine schedule ends at lr x this",
    "weight_decay": "AdamW's decay on matrices and embeddings (none on norm gains and biases)",
    "betas": "AdamW's betas",
    "warmup_steps": "linear warm-up steps before the peak (0: none); must be below steps",
    "schedule": "after warm-up: cosine | inverse_sqrt | constant",
    "grad_clip": "largest global gradient norm (0: no clipping)",
    "eval_every": "steps between evaluations of the valid split",
    "eval_windows": "valid windows per evaluation during training (an estimate)",
    "seed": "seed of the weights' start, the batches and the dropout masks",
    "device": "auto (CUDA when available) | cpu | cuda",
    "precision": "auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16",
    "compile": "torch.compile each block (worth it on a GPU)",
    "on_divergence": "a NaN or inf loss or gradient: stop (exit 3, last good checkpoint kept) | skip_batch",
}

#: Meanings of every other key, as ``section.key``.
HELP = {
    "data.corpus": "stdlib (the Python standard library), a text file, a WikiText-layout folder, a folder of nanoGPT token "
                   "files (train.bin, val.bin), or wikitext-2 / wikitext-103 (-raw) fetched by Hugging Face datasets",
    "data.tokenizer": "bytes | chars | words | bpe (byte-level BPE) | tokens (token files)",
    "data.vocab_size": "token files: the vocabulary size (default: the folder's meta.pkl)",
    "data.token_dtype": "token files: the ids' width, auto (meta.pkl's dtype if it has one, else uint16 up to 65,536 ids, "
                        "uint32 above) | uint16 (nanoGPT's prepare.py) | uint32",
    "data.bpe_vocab_size": "bpe: tokens of the BPE trained on the training split",
    "data.tokenizer_file": "bpe: a Hugging Face tokenizer.json to use instead of training one",
    "data.valid_fraction": "a single text file: the tail share that is the valid split (cut at a line end)",
    "data.test_fraction": "a single text file: the tail share that is the test split",
    "data.arch_fraction": "share of the training split's chunks that form D_alpha (the alphas' data)",
    "data.chunk_tokens": "size of the chunks D_w and D_alpha are drawn from, in tokens",
    "data.cache_dir": "where token arrays are cached (default $XDG_CACHE_HOME/autoln)",
    "model.n_layers": "blocks N (DeepNorm's constants use it)",
    "model.d_model": "width of the residual stream",
    "model.n_heads": "attention heads (must divide d_model)",
    "model.d_ff": "width of the FFN's hidden layer",
    "model.context": "tokens per window",
    "model.dropout": "dropout on the embeddings, attention and FFN",
    "model.norm": "layernorm | rmsnorm | dyt, for every norm of the placements and the final norm",
    "model.candidates": "the placements searched: any of pre post deepnorm peri outnorm lns none (name:fixed: fixed gains)",
    "model.granularity": "layer (one alpha row per block) | sublayer (attention and FFN apart)",
    "model.output_bias": "unigram (the LM head's bias starts at the training split's log unigram frequencies) | none",
    "model.affine": "norm gains and biases: learnable | fixed | search (both forms per site)",
    "model.residual_init": "scaled (branch output projections x 1/sqrt(2N) at init, GPT-2) | unscaled (plain xavier)",
    "model.qk_norm": "QK-norm in every attention, a norm on q and k: [none] | [qk] (per head) | [qk-all] (across heads); several: searched with alphas of its own",
    "search.arch_lr": "Adam learning rate of the alphas (0: alphas fixed at their near-uniform start)",
    "search.arch_betas": "Adam betas of the alphas (DARTS)",
    "search.arch_weight_decay": "weight decay of the alphas (DARTS)",
    "search.arch_init_std": "the alphas start as this x randn",
    "search.order": "1: first-order DARTS | 2: second-order (the unrolled virtual step)",
    "search.mixing": "softmax | gumbel | gumbel-hard | sigmoid",
    "search.tau_start": "mixing temperature at the first step (annealed linearly to tau_end)",
    "search.tau_end": "mixing temperature at the last step",
    "search.zero_one_weight": "Fair DARTS' zero-one loss weight (sigmoid mixing)",
    "search.arch_warmup_steps": "weights only until this step (alphas frozen); below steps",
    "search.beta_reg_max": "beta-DARTS' lambda, rising linearly from 0",
    "search.sdarts_eps": "SDARTS-RS noise bound on the mixing weights in weight steps",
    "search.monitor_windows": "windows for the alpha-Hessian monitor at each evaluation (0: off)",
    "search.early_stop": "none | hessian (R-DARTS: the genotype from before the eigenvalue rise)",
    "search.selection": "perturbation (DARTS-PT) | score (SPOS: whole genotypes scored one-hot) | argmax (DARTS)",
    "search.selection_windows": "fixed D_alpha windows on which the selection measures the supernet",
    "search.selection_tune_steps": "perturbation: bilevel fine-tuning steps between two decisions",
    "search.weight_mode": "how the shared weights train: mixed (DARTS' relaxed mixture) | fair (FairNAS: each candidate of each site once per step) | spos (one uniform path per step)",
    "retrain.final_eval_windows": "windows of valid (at the last step) and of test for the final numbers (null: whole split)",
    "retrain.spike_factor": "a step whose loss exceeds this x the running mean is a loss spike",
    "tune.n_trials": "cap on the study's finished trials, all workers together",
    "tune.score": "proxy_retrain (the derived genotype's valid loss after proxy_steps) | supernet",
    "tune.proxy_steps": "steps of the proxy retrain",
    "tune.pruner": "median | hyperband | none (a tuned search.steps needs none)",
    "tune.sampler": "tpe (multivariate, constant liar) | random",
    "tune.startup_trials": "random trials before TPE, and trials before the median pruner acts",
    "tune.seed": "sampler seed (plus each worker's rank)",
    "tune.rank_offset": "added to the workers' ranks on a second machine, so samplers differ",
    "tune.storage": "null (a journal file in the study folder) | an RDB URL (sqlite:///..., postgresql+psycopg2://...)",
    "tune.study_name": "the study's name in the storage",
    "tune.heartbeat_interval": "RDB: seconds between heartbeats of a running trial",
    "tune.grace_period": "RDB: a trial silent this long is failed and re-run",
    "tune.max_retry": "re-runs of a trial lost with a killed worker",
    "tune.space": "section.key: {log-uniform | uniform | int | categorical: ...}, the hyperparameters tuned",
    "search.candidate_scale": "raw | common: each candidate's output brought to the mixture's RMS (detached) before the weighted sum",
    "race.enabled": "after the search, race its shortlist against the named placements in real retrains (false: the supernet's answer alone)",
    "race.top_k": "the supernet's best whole genotypes by one-hot score entered besides its read-off and argmax",
    "race.eta": "successive halving: each rung keeps the best 1/eta (and the best searched and best named entry)",
    "race.rungs": "rungs of the race, the last at retrain.steps, each earlier one eta times shorter",
    "race.final_seeds": "the final's first look: seeds of each finalist at retrain.steps (retrain.seed + 0, 1, ...); at least 2",
    "race.level": "the final's false-win rate over all its looks (a group-sequential one-sided paired t-test over the seeds)",
    "race.max_seeds": "the final's last look: it goes on seed by seed up to this many while the searched finalist could still win",
    "race.spending": "obrien-fleming | pocock: the alpha-spending function that sets each look's nominal level (docs/race.md)",
    "race.horizons": "multiples of retrain.steps, from 1, at which the finalists are also retrained when the searched one led: does the lead last? e.g. [1, 4]",
    "race.proposer": "none | random | prior | local | ridge | tpe | gp: after the shortlist's rungs, rounds of genotypes this proposer picks from every retrain so far (random: random search through the same race, no shortlist; docs/race.md)",
    "race.budget": "with a proposer: the searched entries' retrain steps, every round together, in full retrains (retrain.steps each); rounds run while the next fits",
    "race.proposals": "with a proposer: genotypes per proposal round",
    "checkpoint.every": "steps between checkpoints (also at each evaluation, the end, and a stop signal: SIGINT, SIGTERM, SIGHUP...)",
    "logging.tensorboard": "write the run's pictures: TensorBoard event files and (a search) alphas.png and alphas_heatmap.png",
    "logging.progress": "a progress bar on a terminal, a line per evaluation in a redirected log",
    "logging.log_every": "steps between training-loss scalars",
}


def meaning(section: str, key: str) -> str:
    """The meaning of ``section.key``.

    Raises:
        KeyError: a key with no entry in :data:`HELP` or :data:`TRAIN_HELP`.
    """
    dotted = f"{section}.{key}"
    if dotted in HELP:
        return HELP[dotted]
    if section in ("search", "retrain") and key in TRAIN_HELP:
        return TRAIN_HELP[key]
    raise KeyError(dotted)


def _default(value) -> str:
    if isinstance(value, dict):
        return "(the default space, see configs/tune.yaml)" if value else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def reference_markdown() -> str:
    """docs/configuration.md: one table per section, ``| key | default | meaning |``."""
    cfg = Config()
    out = ["# Configuration reference", "",
           "Every key, its built-in default and its meaning, generated from `autoln/config/` by "
           "`python -m autoln.config.reference --write docs/configuration.md` (a test keeps it current). Set a key in a YAML "
           "file (`--config FILE`, sections as below) or with `--set section.key=value`. A key left at its default fits the "
           "keys you set (e.g. a warm-up longer than a short run shrinks, with a note); two keys you set that contradict "
           "each other are refused in one line.", ""]
    for section in dataclasses.fields(cfg):
        obj = getattr(cfg, section.name)
        out += [f"## {section.name}", "", "| key | default | meaning |", "|---|---|---|"]
        for f in dataclasses.fields(obj):
            text = meaning(section.name, f.name).replace("|", "\\|")  # a bar inside a table cell
            out.append(f"| `{section.name}.{f.name}` | `{_default(getattr(obj, f.name))}` | {text} |")
        out.append("")
    return "\n".join(out)


def main(argv=None) -> int:
    """``python -m autoln.config.reference [--write FILE]``: print the reference, or write it."""
    args = list(sys.argv[1:] if argv is None else argv)
    text = reference_markdown()
    if args[:1] == ["--write"] and len(args) == 2:
        from autoln.core.io import write_text_atomic

        write_text_atomic(Path(args[1]), text)
        return 0
    if args:
        print("usage: python -m autoln.config.reference [--write FILE]", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
