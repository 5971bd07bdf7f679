"""What ``--resume`` compares, and remedies that work when followed (issue 36, kinds 3 and 7).

- Kind 3: a run made before ``model.residual_init`` existed is refused with "resume with the
  run's own config"; following that (``--config <run>/config.yaml``) resumes, because a run's
  own ``config.yaml`` reads a key it lacks as the earlier behaviour, as checkpoints and records
  do. The same holds for the ``next:`` line of a search (``retrain.py --config <search>/config.yaml``).
- Kind 7: keys that say only where and how fast a run goes (device, compile, precision, the
  token cache's folder) may change on resume, with a note; sections a run does not read
  (``retrain`` for a search, ``search`` for a retrain, ``tune``) may change silently; a key that
  changes the result is still refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from autoln import cli
from autoln.config import load_config

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")
SEARCH = ["--config", TINY, "--set", "race.enabled=false", "--set", "search.steps=8", "--set", "search.arch_warmup_steps=2", "--set", "search.eval_every=4",
          "--set", "search.selection=argmax", "--set", "logging.progress=false", "--set", "logging.tensorboard=false"]
RETRAIN = ["--genotype", "all-pre", "--set", "retrain.steps=8", "--set", "retrain.eval_every=4", "--set", "logging.progress=false",
           "--set", "logging.tensorboard=false"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def interrupted(out: Path, finished: str, edit=None) -> None:
    """Make the finished run in ``out`` one killed after its last checkpoint; ``edit(config)``
    changes the config recorded in its checkpoint and its ``config.yaml`` (an older autoln's)."""
    (out / finished).unlink()
    if edit is None:
        return
    ckpt = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False)
    edit(ckpt["config"])
    torch.save(ckpt, out / "checkpoint.pt")
    config = yaml.safe_load((out / "config.yaml").read_text())
    edit(config)
    (out / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def before_residual_init(config: dict) -> None:
    del config["model"]["residual_init"]


def test_a_run_older_than_a_key_resumes_with_its_own_config_as_the_refusal_says(tmp_path, cache, capsys):
    out = tmp_path / "old"
    assert cli.retrain_main([*RETRAIN, "--config", TINY, "--out", str(out)]) == 0
    interrupted(out, "metrics.json", before_residual_init)
    capsys.readouterr()
    assert cli.retrain_main([*RETRAIN, "--config", TINY, "--out", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert "model.residual_init (checkpoint 'unscaled', now 'scaled')" in err
    assert (f"Resume with the run's own config (--config {out / 'config.yaml'}, without the --set of those keys), "
            "or start a new run (--overwrite in place of --resume, or another --out)") in err
    # the remedy, followed as printed
    assert cli.retrain_main([*RETRAIN, "--config", str(out / "config.yaml"), "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"note: {out / 'config.yaml'} has no model.residual_init (the run is older than the key): read as 'unscaled'" in err
    assert (out / "metrics.json").is_file()
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["residual_init"] == "unscaled"


def test_the_next_line_of_an_older_search_retrains_with_what_the_search_did(tmp_path):
    search = tmp_path / "search"
    search.mkdir()
    config = load_config(TINY).to_dict()
    del config["model"]["residual_init"]
    (search / "config.yaml").write_text(yaml.safe_dump(config))
    assert load_config(search / "config.yaml").model.residual_init == "scaled"  # not a run folder yet: today's default
    (search / "genotype.json").write_text("{}")
    assert load_config(search / "config.yaml").model.residual_init == "unscaled"  # a run's own record
    assert load_config(TINY).model.residual_init == "scaled"  # a user's partial config: today's default


def test_a_search_moved_from_a_gpu_to_a_cpu_resumes_with_a_note(tmp_path, cache, capsys):
    out = tmp_path / "gpu"
    assert cli.search_main([*SEARCH, "--out", str(out)]) == 0
    interrupted(out, "genotype.json", lambda c: c["search"].update(device="cuda", compile=True, precision="bf16"))
    capsys.readouterr()
    assert cli.search_main([*SEARCH, "--set", "search.device=cpu", "--out", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert ("note: --resume with search.compile (checkpoint True, now False); search.device (checkpoint 'cuda', now 'cpu'); "
            "search.precision (checkpoint 'bf16', now 'auto'): the run goes on from its checkpoint, but is no longer bitwise "
            "equal to an uninterrupted run") in err
    assert (out / "genotype.json").is_file()


def test_sections_a_run_does_not_read_may_change_and_a_result_key_may_not(tmp_path, cache, capsys):
    out = tmp_path / "s"
    assert cli.search_main([*SEARCH, "--out", str(out)]) == 0
    interrupted(out, "genotype.json")
    capsys.readouterr()
    # a search reads neither retrain.* nor tune.*
    assert cli.search_main([*SEARCH, "--set", "retrain.steps=50", "--set", "tune.n_trials=3", "--out", str(out), "--resume"]) == 0
    assert "note: --resume" not in capsys.readouterr().err
    r = tmp_path / "r"
    assert cli.retrain_main([*RETRAIN, "--config", TINY, "--out", str(r)]) == 0
    interrupted(r, "metrics.json")
    capsys.readouterr()
    assert cli.retrain_main([*RETRAIN, "--config", TINY, "--set", "search.lr=0.01", "--set", "retrain.lr=0.01", "--out", str(r),
                             "--resume"]) == 2
    err = capsys.readouterr().err
    assert "1 key(s): retrain.lr (checkpoint 0.002, now 0.01)" in err and "search.lr" not in err


def test_a_finished_retrain_made_on_another_device_or_compiled_stands_for_this_one(tmp_path):
    from autoln.engine.folders import run_config_differences

    cfg = load_config(TINY)
    made = cfg.to_dict()
    made["retrain"].update(device="cuda", compile=True, precision="bf16")
    made["data"]["cache_dir"] = "/elsewhere"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(made))
    assert run_config_differences(tmp_path, cfg) == []
    made["retrain"]["lr"] = 0.01
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(made))
    assert run_config_differences(tmp_path, cfg) == ["retrain.lr (0.01 -> 0.002)"]
