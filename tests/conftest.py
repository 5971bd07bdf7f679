"""Fixtures: tiny model configs, the developers' corpora (skipped when absent)."""

from __future__ import annotations

import importlib.util
import sys
import os
from types import ModuleType
from pathlib import Path

# One torch thread per test process (set before torch is imported): the suite runs one pytest-xdist
# worker per core (pyproject's addopts), and threads beyond the cores only wait on each other.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from autoln.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
#: The developers' copy of the real corpora (WikiText-2, tiny Shakespeare), beside the
#: repository in CI and dev checkouts; a user's clone has none, and the tests using it skip.
SHARED_DATA = ROOT.parent / "shared" / "data"


def shared_path(*parts: str) -> Path:
    """A file or folder under :data:`SHARED_DATA`, or skip the test with the reason."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} not found: the shared corpora sit beside the repository in CI and dev checkouts, not in a fresh clone")
    return path


def experiment_script(name: str) -> ModuleType:
    """``experiments/<folder>/<script>.py`` loaded as a fresh module, for ``name``
    ``"<folder>/<script>"`` (each script puts the repository root on ``sys.path`` itself, for its
    imports of ``experiments.<folder>.<script>``)."""
    path = ROOT / "experiments" / f"{name}.py"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such experiment script (name it as '<folder>/<script>')")
    spec = importlib.util.spec_from_file_location(f"experiment_{name.replace('/', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses read their module's namespace while the module runs
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tiny_model_cfg() -> ModelConfig:
    return ModelConfig(n_layers=3, d_model=16, n_heads=2, d_ff=32, context=8)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture
def cache_dir(tmp_path) -> str:
    return str(tmp_path / "cache")


@pytest.fixture(autouse=True)
def _retrain_table(tmp_path, monkeypatch):
    """The experiment scripts read and extend a retrain table: in tests, a fresh one per test,
    never the repository's experiments/retrains.csv."""
    monkeypatch.setenv("AUTOLN_RETRAIN_TABLE", str(tmp_path / "retrains.csv"))
