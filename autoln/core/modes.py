"""A model's train/eval modes, module by module: whatever autoln switches to train or evaluate
a model is switched back as it was found, each module to its own mode.

``model.train(was_training)`` after an evaluation would set every module to the model's mode,
and so unfreeze a module the user had put in eval mode inside a model in train mode (a frozen
BatchNorm, whose running statistics then move: Lightning-AI/pytorch-lightning#2551,
quark0/darts#85). :func:`eval_mode` and :func:`train_mode` restore each module's own flag, and
:func:`train_mode` trains around such a frozen module.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Optional

from torch import nn


def saved_modes(model: nn.Module) -> list[tuple[nn.Module, bool]]:
    """``(module, its training flag)`` for ``model`` and every module inside it."""
    return [(m, m.training) for m in model.modules()]


def restore_modes(saved: list[tuple[nn.Module, bool]]) -> None:
    """Set each module of ``saved`` (:func:`saved_modes`) back to its own flag."""
    for module, training in saved:
        module.training = training


def frozen_modules(model: nn.Module) -> list[nn.Module]:
    """The modules in eval mode inside ``model`` in train mode (a frozen BatchNorm, a dropout
    switched off on purpose); none when ``model`` itself is in eval mode (then every module is,
    and none is told apart)."""
    return [m for m in model.modules() if not m.training] if model.training else []


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode inside the ``with``; afterwards each module in the mode it had."""
    saved = saved_modes(model)
    model.eval()
    try:
        yield
    finally:
        restore_modes(saved)


@contextmanager
def train_mode(model: nn.Module, root: Optional[nn.Module] = None) -> Iterator[list[nn.Module]]:
    """``model`` in train mode inside the ``with``, except the modules frozen in ``root``
    (default ``model``; :func:`frozen_modules`), which stay in eval mode; afterwards each module
    in the mode it had (a model given in eval mode is in eval mode again). Yields the frozen
    modules. ``root``: the user's model inside a wrapper of autoln's (a
    :class:`autoln.api.SearchModel`), whose own flag says nothing of the user's intent."""
    saved = saved_modes(model)
    frozen = frozen_modules(model if root is None else root)
    model.train()
    for module in frozen:
        module.training = False
    try:
        yield frozen
    finally:
        restore_modes(saved)
