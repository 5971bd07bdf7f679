"""Where one setting travels: the autoln modules whose functions receive a configuration
(``Config`` or one of its sections) during one tiny retrain (``retrain.compare.retrain_one`` of
``all-pre`` on ``configs/tiny.yaml`` at 10 steps), in call order, with the distinct modules, the
moves between them and the moves back to a module left earlier. A measure of how far a reader
follows ``cfg`` through the package (docs/design.md §12)::

    python benchmarks/cfg_path.py [REPOSITORY]   # default: this one; another checkout to compare
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
import tempfile
from pathlib import Path


def trace(root: str) -> list[str]:
    """The modules, in call order (a repeat only after another module), that receive a config."""
    sys.path.insert(0, root)
    from autoln.config import load_config

    try:
        compare = importlib.import_module("autoln.retrain.compare")
    except ImportError:  # the flat layout before the folders
        compare = importlib.import_module("autoln.compare")
    cfg = load_config(os.path.join(root, "configs/tiny.yaml"), ["retrain.steps=10", "retrain.eval_every=5",
                                                                 "retrain.warmup_steps=2", "logging.progress=false",
                                                                 "logging.tensorboard=false"])
    seq: list[str] = []

    def is_config(v) -> bool:
        return dataclasses.is_dataclass(v) and not isinstance(v, type) and type(v).__name__.endswith("Config")

    def profile(frame, event, arg):
        if event != "call":
            return
        module, code = frame.f_globals.get("__name__", ""), frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        if module.startswith("autoln") and any(is_config(frame.f_locals.get(n)) for n in names) and (not seq or seq[-1] != module):
            seq.append(module)

    sys.setprofile(profile)
    try:
        compare.retrain_one(cfg, "all-pre", "all-pre", os.path.join(tempfile.mkdtemp(), "run"), False, None)
    finally:
        sys.setprofile(None)
    return seq


def summary(seq: list[str], level: int = 0) -> str:
    """Distinct modules (or folders, ``level`` 1), moves, and moves back to one left earlier."""
    if level:
        names = [m.split(".")[1] for m in seq]
        seq = [n for i, n in enumerate(names) if i == 0 or names[i - 1] != n]
    back = sum(1 for i, m in enumerate(seq) if m in seq[:i])
    return f"{len(set(seq))} {'folders' if level else 'modules'}, {len(seq) - 1} moves, {back} back to one left earlier"


def main(argv=None) -> int:
    root = str(Path((argv or sys.argv[1:] or [str(Path(__file__).resolve().parents[1])])[0]).resolve())
    seq = trace(root)
    print(summary(seq))
    if any(m.count(".") > 1 for m in seq):
        print(summary(seq, 1))
    print(" -> ".join(m.removeprefix("autoln.") for m in seq))
    return 0


if __name__ == "__main__":
    sys.exit(main())
