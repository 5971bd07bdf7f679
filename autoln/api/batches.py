"""The batches a user passes :func:`autoln.search`: checked before the first step
(:func:`check_batches`), drawn without end (:class:`BatchStream`, counted so a resumed search
replays them), and the read-off's first fixed batches (:func:`first_batches`).
"""

from __future__ import annotations

from typing import Iterable

import torch

from autoln.api.sites import as_pair


def check_batches(batches, what: str, at_least: int = 1) -> None:
    """Refuse, before the first step, ``batches`` that cannot serve a search: not iterable; or,
    for a list or tuple (which can be looked at without drawing from it), fewer than
    ``at_least`` batches or a first batch that is not an ``(x, y)`` pair of tensors. Other
    iterables (a DataLoader, an endless generator as nanoGPT's ``get_batch`` loop) are checked
    batch by batch as they are drawn: looking ahead would draw from them.

    Raises:
        ValueError: naming ``what`` and what was expected."""
    if not hasattr(batches, "__iter__"):
        raise ValueError(f"{what}: expected a list, a DataLoader or a generator of (x, y) batches, got a {type(batches).__name__}")
    if isinstance(batches, (list, tuple)):
        if len(batches) < at_least:
            need = (f"at least {at_least} (without arch_batches every other batch is a D_alpha batch)" if at_least > 1 else "one")
            raise ValueError(f"{what} gave {len(batches)} batch{'es' if len(batches) != 1 else ''}, expected {need}")
        for i, batch in enumerate(batches[:at_least]):
            as_pair(batch, what, i)


class BatchStream:
    """``(x, y)`` batches without end from ``batches`` (a list or a DataLoader), re-iterated when
    used up and moved to ``device``; it counts what it gave, so a resumed search replays the
    iterable from its start and skips as many (bitwise for a list or a seeded DataLoader).

    Raises (when drawn):
        ValueError: ``batches`` gives no batch at all (e.g. a generator already used up).
    """

    def __init__(self, batches: Iterable, what: str, device: torch.device) -> None:
        self.batches, self.what, self.device = batches, what, device
        self.drawn, self._it = 0, None

    def _next_raw(self):
        for _ in range(2):
            if self._it is None:
                self._it = iter(self.batches)
            try:
                return next(self._it)
            except StopIteration:
                self._it = None
        raise ValueError(f"{self.what} gave no batch (expected (x, y) pairs; a generator is used up after one pass: "
                         "pass a list or a DataLoader)")

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = as_pair(self._next_raw(), self.what, self.drawn)
        self.drawn += 1
        return x.to(self.device), y.to(self.device)

    def state_dict(self) -> dict:
        """``{"drawn": n}``: the batches given so far."""
        return {"drawn": self.drawn}

    def load_state_dict(self, state: dict) -> None:
        """Start again from the iterable's first batch and skip the ``drawn`` ones."""
        self._it, self.drawn = None, 0
        for _ in range(int(state["drawn"])):
            self._next_raw()
            self.drawn += 1


def first_batches(batches: Iterable, windows: int, what: str, every: int = 1, offset: int = 0) -> list:
    """The first batches of a fresh pass over ``batches`` (taking every ``every``-th from
    ``offset``) until they hold ``windows`` rows (at least one batch): the read-off's fixed
    D_alpha windows, as ``search.py``'s ``selection_windows``.

    Raises:
        ValueError: ``batches`` gives no batch."""
    out, rows = [], 0
    for i, batch in enumerate(batches):
        if i % every != offset:
            continue
        out.append(as_pair(batch, what, i))
        rows += len(out[-1][0])
        if rows >= windows:
            break
    if not out:
        raise ValueError(f"{what} gave no batch (expected (x, y) pairs)")
    return out
