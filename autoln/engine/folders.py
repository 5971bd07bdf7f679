"""Reading a finished retrain's folder: its ``metrics.json`` and how its config differs from another.

Shared by :mod:`autoln.retrain.run_retrain` (``retrain_reusing``) and :mod:`autoln.retrain.compare`, below both,
so that neither imports the other to read a run (compare -> run_retrain -> runs, one way).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from autoln.config import PLACE_KEYS, Config, read_yaml, with_defaults
from autoln.core.io import read_json

METRICS_FILE = "metrics.json"
#: What a run's config may differ in from another's and still be the same retrain: where and
#: how fast it ran (:data:`autoln.config.PLACE_KEYS`) and the searched candidates.
SAME_RUN_FREE = (*PLACE_KEYS, "model.candidates")


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """``key (old -> new)`` for every leaf that differs between two nested dicts (keys joined
    with ``.`` under ``prefix``; a key missing on one side reads as None). Raises nothing."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key} ({a!r} -> {b!r})")
    return out


def read_metrics(path: str | Path) -> Optional[dict]:
    """The record of a finished retrain (``metrics.json``), or None when it is missing or
    damaged: unreadable, not JSON, or without the fields every finished retrain writes
    (``placements``, and ``valid`` and ``test`` with their metrics). Raises nothing."""
    m = read_json(path)
    if not isinstance(m, dict) or not isinstance(m.get("placements"), str):
        return None
    if not all(isinstance(m.get(split), dict) and m[split] for split in ("valid", "test")):
        return None
    return m


def run_config_differences(run_dir: Path, cfg: Config) -> list[str]:
    """How the retrain in ``run_dir`` (its ``config.yaml``) was made differently from ``cfg``,
    in ``data``, ``model`` and ``retrain`` (seed included; :data:`SAME_RUN_FREE` aside): empty
    when it is the retrain ``cfg`` would make of the same placements. A missing or unreadable
    ``config.yaml`` is one difference (nothing is raised)."""
    import yaml

    try:
        saved = with_defaults(read_yaml((run_dir / "config.yaml").read_text(encoding="utf-8")) or {})
    except (OSError, UnicodeDecodeError, yaml.YAMLError, AttributeError, TypeError):
        return [f"{run_dir / 'config.yaml'} unreadable"]
    keep = ("data", "model", "retrain")
    a = {k: dict(v) for k, v in saved.items() if k in keep and isinstance(v, dict)}
    b = {k: dict(v) for k, v in cfg.to_dict().items() if k in keep}
    for key in SAME_RUN_FREE:
        section, name = key.split(".")
        a.get(section, {}).pop(name, None)
        b.get(section, {}).pop(name, None)
    return differences(a, b)
