"""The settings of :func:`autoln.search`: its default schedule (:func:`default_config`), the
warning when the alphas cannot separate in the steps given (:func:`alpha_travel_warning`), and
its arguments checked before anything is built (:func:`check_search`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Optional

from torch import nn

from autoln.api.batches import check_batches
from autoln.api.run_folder import check_folder
from autoln.config import SearchConfig


def default_config(steps: Optional[int] = None) -> SearchConfig:
    """The search settings of ``autoln.search`` without ``cfg``: ``search.py``'s default
    (:class:`autoln.config.SearchConfig`: 500 steps, warm-ups of 50 steps for the weights'
    learning rate and 100 for the alphas, perturbation-based selection). ``steps`` below the
    default's scale the two warm-ups with them (a tenth and a fifth of ``steps``), so the
    schedule keeps its shape; at or above 500 the warm-ups are the command's, as
    ``--set search.steps=N`` leaves them.

    Raises:
        ValueError: ``steps`` not a positive integer."""
    cli = SearchConfig()
    if steps is None:
        return cli
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"autoln.search: steps: expected a positive integer, got {steps!r}")
    return replace(cli, steps=steps, warmup_steps=min(cli.warmup_steps, steps // 10),
                   arch_warmup_steps=min(cli.arch_warmup_steps, steps // 5))


def alpha_travel_warning(cfg: SearchConfig, n_candidates: int) -> Optional[str]:
    """One line when the alphas cannot go far enough in ``cfg``'s steps, else None.

    Adam moves each alpha by about ``arch_lr`` per alpha step at most, so after the
    ``steps - arch_warmup_steps`` alpha steps two alphas of a site are at most
    ``2 * arch_lr * (steps - arch_warmup_steps)`` apart (logits, nats). One of ``K`` candidates
    reaches probability 0.9 at a gap of ``ln(9 (K - 1))`` (2.9 for ``K = 3``); below that the
    read-off decides between near-uniform probabilities. ``search.py``'s default reaches 8.0.
    ``arch_lr = 0`` (alphas frozen on purpose, DARTS-PT's uniform supernet) and
    ``selection = "score"`` (whole genotypes scored, the alphas not read) give None. The line
    has no prefix; :func:`search` prints it after ``autoln.search: warning:``."""
    if cfg.arch_lr == 0 or n_candidates < 2 or cfg.selection == "score":
        return None
    alpha_steps = max(cfg.steps - cfg.arch_warmup_steps, 0)
    reach, need = 2 * cfg.arch_lr * alpha_steps, math.log(9 * (n_candidates - 1))
    if reach >= need:
        return None
    return (f"the alphas cannot separate in {cfg.steps} steps: {alpha_steps} alpha steps at "
            f"arch_lr {cfg.arch_lr:g} move them at most {reach:.2f} apart, and one of {n_candidates} candidates needs "
            f"{need:.2f} to reach probability 0.9; give more steps ({math.ceil(need / (2 * cfg.arch_lr))} alpha steps after "
            f"the {cfg.arch_warmup_steps}-step warm-up at least; the command's default is {SearchConfig().steps} steps) "
            f"or a larger arch_lr in cfg")


def check_search(model, steps, seed, shortlist, checkpoint_every, cfg, loss_fn, on_eval, out, tensorboard, resume,
                 train_batches, arch_batches, selection_batches, valid_batches) -> tuple[SearchConfig, Optional[Path]]:
    """:func:`search`'s arguments checked, before anything is built: ``(the settings, validated,
    with ``steps``; the run folder or None)``.

    Raises:
        ConfigError, OutputError, ValueError: as :func:`search` says."""
    from autoln.core.errors import ConfigError

    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ValueError(f"autoln.search: steps: expected a positive integer, got {steps!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"autoln.search: seed: expected an integer, got {seed!r}")
    if isinstance(shortlist, bool) or not isinstance(shortlist, int) or not 0 <= shortlist <= 10:
        raise ValueError(f"autoln.search: shortlist: expected an integer from 0 to 10, got {shortlist!r}")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 0:
        raise ValueError(f"autoln.search: checkpoint_every: expected an integer >= 0 (0: only at evaluations and on "
                         f"signals), got {checkpoint_every!r}")
    if not isinstance(model, nn.Module):
        raise ValueError(f"autoln.search: model: expected your model (an nn.Module with autoln.Site s), got a {type(model).__name__}")
    if cfg is not None and not isinstance(cfg, SearchConfig):
        hint = ": autoln.SearchConfig(**cfg) builds one from it" if isinstance(cfg, dict) else ""
        raise ConfigError(f"autoln.search: cfg: expected an autoln.SearchConfig, e.g. autoln.SearchConfig(steps=200), got a "
                          f"{type(cfg).__name__}{hint}")
    for name, fn in (("loss_fn", loss_fn), ("on_eval", on_eval)):
        if fn is not None and not callable(fn):
            raise ValueError(f"autoln.search: {name}: expected a function, got a {type(fn).__name__}")
    try:
        cfg = default_config(steps) if cfg is None else cfg if steps is None else replace(cfg, steps=steps)
        cfg.validate()
    except ConfigError as exc:  # the message names the key; the remedy in the API's terms
        raise ConfigError(f"autoln.search: cfg: {str(exc).split(' (e.g. --set')[0]}; in the API pass "
                          f"autoln.SearchConfig(..., key=value), or start from autoln.api.default_config({cfg.steps}), "
                          "whose warm-ups fit the steps") from None
    if out is None and (tensorboard or resume):
        raise ValueError("autoln.search: tensorboard and resume need a run folder: pass out=...")
    check_batches(train_batches, "train_batches", 1 if arch_batches is not None else 2)
    for what, batches in (("arch_batches", arch_batches), ("selection_batches", selection_batches),
                          ("valid_batches", valid_batches)):
        if batches is not None:
            check_batches(batches, what)
    if out is not None:
        out = Path(out)
        check_folder(out, resume)
    return cfg, out
