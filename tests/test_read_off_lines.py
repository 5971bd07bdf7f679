"""The read-off is not silent: in a redirected log a search says when its read-off starts (what
it does and its estimated time), how far it is with the time left, and when it ends; for
``search.py`` and ``autoln.search`` alike (autoln.oneshot.search_pieces.Progress)."""

from __future__ import annotations

import re

import pytest

from autoln.config import load_config
from autoln.oneshot.run_search import run_search
from autoln.oneshot.selection import most_scored

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")
CLOCK = r"\d\d:\d\d"


def read_off_lines(err: str) -> list[str]:
    """The lines a read-off wrote, after the search's last step line."""
    lines = err.splitlines()
    last_step = max(i for i, line in enumerate(lines) if line.startswith("search step "))
    return [line for line in lines[last_step + 1:] if line.startswith("read-off: ")]


def test_most_scored_is_every_genotype_or_the_evolution_s_population_times_generations():
    assert most_scored(3, 2) == 9 and most_scored(3, 7) == 2187  # every one of 3^7 <= 4096
    assert most_scored(3, 12) == 1000 and most_scored(2, 13) == 1000  # SPOS: 50 per generation, 20 generations


@pytest.mark.parametrize("top_k, parts", [(3, ["scoring the shortlist", "perturbation selection"]), (0, ["perturbation selection"])])
def test_a_redirected_read_off_writes_its_start_progress_and_end(tmp_path, capsys, top_k, parts):
    cfg = load_config(TINY, ["logging.progress=true", "logging.tensorboard=false", "search.steps=12", "search.eval_every=6",
                             "search.arch_warmup_steps=4", "search.selection_tune_steps=2", f"race.top_k={top_k}"])
    run_search(cfg, tmp_path / "s")
    lines = read_off_lines(capsys.readouterr().err)  # capsys: stderr is not a terminal, as in a redirected log
    start, *progress, end = lines
    # the start: what it will do, and an estimate in time
    shortlist = "scoring up to 9 genotypes for the race's shortlist; then " if top_k else ""
    assert re.fullmatch(rf"read-off: {re.escape(shortlist)}perturbation selection of 2 sites \(4 loss evaluations each, 2 "
                        rf"fine-tuning steps between two\): about {CLOCK} \(a loss evaluation takes \S+ s, a step \S+ s\)", start)
    # progress: each decision (at most 20 in a part) with the read-off's time left, in order
    expected = [f"{parts[0]} {i}/9 genotypes" for i in range(1, 10)] if top_k else []
    expected += [f"perturbation selection {i}/2 sites" for i in (1, 2)]
    assert [re.sub(rf" \((about {CLOCK} left|time left: after the first) for the read-off\)$", "", line)[len("read-off: "):]
            for line in progress] == expected
    assert all(line.endswith(" for the read-off)") for line in progress)
    assert re.fullmatch(rf"read-off: done in {CLOCK} \(estimated {CLOCK}\)", end)


def test_autoln_search_s_read_off_speaks_too_and_its_loss_has_a_unit(capsys):
    import autoln
    from autoln.data import load_corpus

    from .test_search_loop import api_batches, autoln_model_as_user_model

    cfg = load_config(TINY, ["search.steps=12", "search.eval_every=6", "search.arch_warmup_steps=4", "search.selection_tune_steps=2"])
    corpus = load_corpus(cfg.data)
    weights, alphas, fixed = api_batches(cfg, corpus)
    autoln.search(autoln_model_as_user_model(cfg, corpus), weights, steps=12, arch_batches=alphas, cfg=cfg.search,
                  selection_batches=fixed, shortlist=2)
    err = capsys.readouterr().err
    steps = [line for line in err.splitlines() if line.startswith("search step ")]
    assert [re.match(r"search step (\d+)/12: train loss \d+\.\d{3} nats/token \(", line).group(1) for line in steps] == ["6", "12"]
    lines = read_off_lines(err)
    assert lines[0].startswith("read-off: scoring up to 9 genotypes for the race's shortlist; then perturbation selection of "
                               "2 sites (4 loss evaluations each, 2 fine-tuning steps between two): about ")
    assert [line.split(" (")[0] for line in lines[-3:-1]] == ["read-off: perturbation selection 1/2 sites",
                                                              "read-off: perturbation selection 2/2 sites"]
    assert lines[-1].startswith("read-off: done in ")
