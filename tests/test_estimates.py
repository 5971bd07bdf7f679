"""Estimates that carry their error: every valid evaluation before a retrain's last step
measures a subset of the final number's windows, and the log lines and TensorBoard carry its
standard error, as the final number does (the search's supernet valid too)."""

from __future__ import annotations

import re

import numpy as np
import pytest

import autoln.retrain.run_retrain as rr
import autoln.oneshot.run_search as rs
from autoln.config import load_config
from autoln.data import estimate_starts, estimate_text, eval_starts

from .conftest import ROOT
from .test_resume import scalars

TINY = ROOT / "configs" / "tiny.yaml"


@pytest.mark.parametrize("n_tokens, context, final, estimate", [
    (1_121_681, 256, 512, 64), (100_000, 64, 512, 64), (10_000, 64, None, 16), (5_000, 64, 512, 64), (100_000, 64, 100, 7)])
def test_the_estimate_windows_are_a_subset_of_the_final_ones(n_tokens, context, final, estimate):
    fin = eval_starts(n_tokens, context, final)
    est = estimate_starts(fin, estimate)
    assert set(est) <= set(fin) and len(est) == min(estimate, len(fin)) and len(set(est)) == len(est)
    assert est[0] == fin[0] and est[-1] == fin[-1]  # spread over the whole split, as the final windows are
    # the issue's case: 64 of 512 on WikiText-2's valid split; the old estimate windows were not all final ones
    if (n_tokens, final, estimate) == (1_121_681, 512, 64):
        assert not set(eval_starts(n_tokens, context, estimate)) <= set(fin)


def test_estimate_text_carries_the_standard_error():
    assert estimate_text({"bits_per_byte": 2.3671, "bits_per_byte_stderr": 0.0714}, "bits_per_byte") == "2.367 ± 0.071 bits/byte"
    assert estimate_text({"bits_per_byte": 2.3671}, "bits_per_byte") == "2.367 bits/byte"
    assert estimate_text(None, "bits_per_byte") == "-"


def test_a_retrain_s_estimates_are_final_windows_and_every_line_carries_its_error(tmp_path, monkeypatch, capsys):
    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    cfg = load_config(TINY, ["retrain.steps=6", "retrain.eval_every=2", "retrain.eval_windows=3", "retrain.final_eval_windows=8",
                             "retrain.warmup_steps=1", "logging.progress=true", f"data.corpus={text}",
                             f"data.cache_dir={tmp_path / 'cache'}"])
    seen = []
    real = rr.measure

    def spy(model, tokens, starts, *args, **kwargs):
        seen.append(np.array(starts))
        return real(model, tokens, starts, *args, **kwargs)

    monkeypatch.setattr(rr, "measure", spy)
    rr.run_retrain(cfg, "all-pre", tmp_path / "run")
    err = capsys.readouterr().err
    valid_evals, final_test = seen[:-1], seen[-1]
    assert [len(s) for s in valid_evals] == [3, 3, 8] and len(final_test) == 8
    assert all(set(s) <= set(valid_evals[-1]) for s in valid_evals[:-1])  # estimates: a subset of the final windows
    lines = [ln for ln in err.splitlines() if ln.startswith("retrain step ")]
    assert len(lines) == 3 and all(re.search(r"valid \d+\.\d{3} ± \d+\.\d{3} bits/byte \((3|8) windows\)", ln) for ln in lines)
    se = [v for _, v in scalars(tmp_path / "run", "valid/bits_per_byte_stderr")]
    assert len(se) == 3 and all(v > 0 for v in se)


def test_the_search_s_supernet_valid_carries_its_error(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8") * 2, encoding="utf-8")
    cfg = load_config(TINY, ["search.steps=4", "search.eval_every=2", "search.warmup_steps=1", "search.arch_warmup_steps=1",
                             "search.eval_windows=4", "search.selection=argmax", "logging.progress=true",
                             f"data.corpus={text}", f"data.cache_dir={tmp_path / 'cache'}"])
    result = rs.run_search(cfg, tmp_path / "s")
    assert result.valid["bits_per_byte_stderr"] > 0 and result.valid["windows"] == 4
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("search step ")]
    assert lines and all(re.search(r"supernet valid \d+\.\d{3} ± \d+\.\d{3} bits/byte", ln) for ln in lines)
    assert len(scalars(tmp_path / "s", "valid/bits_per_byte_stderr")) == 2


def test_time_left_is_the_work_left_at_the_rate_so_far():
    """:class:`autoln.engine.training.TimeLeft`: a run resumed at step 100 of 500 that reaches step 200
    after 10 s has 300 steps left at 10 steps/s: 30 s, in tqdm's format; a bound says so."""
    from autoln.engine.training import TimeLeft

    now = [50.0]
    eta = TimeLeft(100, 500, clock=lambda: now[0])
    assert eta.seconds(100) is None and eta.text(100) == "time left: after the first"
    now[0] = 60.0
    assert eta.seconds(200) == pytest.approx(30.0) and eta.text(200) == "about 00:30 left"
    assert eta.text(200, total=4100, bound=True) == "at most about 06:30 left"
