"""One search loop (issue 35): ``search.py``'s job and ``autoln.search`` on the same model, data
and seed give bitwise the same alphas and genotype, for every read-off; ``autoln.search``
resumes bitwise after an interruption and writes TensorBoard events when asked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import autoln
from autoln.api import SearchModel
from autoln.config import load_config
from autoln.core.errors import OutputError
from autoln.data import WindowSampler, arch_split, eval_batches, load_corpus
from autoln.models.model import TransformerLM
from autoln.oneshot.run_search import run_search
from autoln.engine.training import seed_everything

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")


class Draws:
    """An endless iterable over a sampler's batches (what search.py draws, in order)."""

    def __init__(self, sampler: WindowSampler) -> None:
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield self.sampler.sample()


def autoln_model_as_user_model(cfg, corpus) -> SearchModel:
    """autoln's own TransformerLM with every candidate at every site, wrapped as a user's model:
    drawn in the order search.py draws its supernet (weights, then alphas), a block's two sites
    sharing one alpha row as ``granularity: layer`` does."""
    sc, mc = cfg.search, cfg.model
    cands = mc.searched_candidates()
    seed_everything(sc.seed)
    lm = TransformerLM(mc, corpus.vocab_size, [(cands, cands)] * mc.n_layers).init_output_bias(corpus.unigram_log_probs())
    groups = [[f"blocks.{i}.attn_site", f"blocks.{i}.ffn_site"] for i in range(mc.n_layers)]
    return SearchModel(lm, arch_init_std=sc.arch_init_std, tau=sc.tau_start, mixing=sc.mixing, groups=groups)


def api_batches(cfg, corpus):
    """search.py's D_w and D_alpha streams and its read-off windows, as the API takes them."""
    sc, mc = cfg.search, cfg.model
    train = corpus.splits["train"]
    w_chunks, a_chunks = arch_split(len(train), mc.context, cfg.data.chunk_tokens, cfg.data.arch_fraction, sc.seed)
    weights = Draws(WindowSampler(train, w_chunks, mc.context, sc.batch_size, seed=[sc.seed, 1]))
    alphas = Draws(WindowSampler(train, a_chunks, mc.context, sc.batch_size, seed=[sc.seed, 2]))
    starts = WindowSampler(train, a_chunks, mc.context, sc.selection_windows, seed=[sc.seed, 5]).sample_starts()
    return weights, alphas, list(eval_batches(train, starts, mc.context, sc.batch_size))


@pytest.mark.parametrize("selection", ["perturbation", "argmax", "score"])
def test_search_py_and_autoln_search_give_bitwise_the_same_alphas_and_genotype(tmp_path, selection):
    cfg = load_config(TINY, ["logging.progress=false", "logging.tensorboard=false", f"search.selection={selection}",
                             "search.steps=30", "search.arch_warmup_steps=10"])
    cli = run_search(cfg, tmp_path / "cli")
    corpus = load_corpus(cfg.data)
    model = autoln_model_as_user_model(cfg, corpus)
    weights, alphas, fixed = api_batches(cfg, corpus)
    outcome = autoln.search(model, weights, steps=cfg.search.steps, arch_batches=alphas, cfg=cfg.search,
                            seed=cfg.search.seed, progress=False, selection_batches=fixed)
    assert torch.equal(cli.model.alphas.detach(), outcome.model.alphas.detach())
    per_site = list(outcome.genotype.sites.values())
    assert per_site == [p for block in cli.genotype.placements for p in (block, block)]
    np.testing.assert_array_equal(np.asarray(list(outcome.genotype.probabilities.values()))[::2],
                                  np.asarray(cli.genotype.probabilities))
    if selection == "perturbation":  # the loss rises of each decision, to the last bit
        rises = cli.genotype.provenance["selection"]["loss_rises"]
        assert [outcome.genotype.provenance["loss_rises"][f"blocks.{i}.attn_site"] for i in range(len(rises))] == rises


def tiny_user_run(tmp_path, **kwargs):
    """autoln.search on the tiny example-size model over fixed lists of batches."""
    cfg = load_config(TINY, ["search.steps=40", "search.eval_every=10", "search.arch_warmup_steps=8"])
    corpus = load_corpus(cfg.data)
    model = autoln_model_as_user_model(cfg, corpus)
    weights, alphas, fixed = api_batches(cfg, corpus)
    take = lambda it, n: [next(iter_) for iter_ in [iter(it)] for _ in range(n)]  # noqa: E731
    return autoln.search(model, take(weights, 17), steps=40, arch_batches=take(alphas, 13), cfg=cfg.search,
                         progress=False, selection_batches=fixed, **kwargs)


def test_autoln_search_resumes_bitwise_after_an_interruption(tmp_path):
    whole = tiny_user_run(tmp_path)

    class Stop(Exception):
        pass

    def stop_at_20(step, metrics):
        if step == 20:
            raise Stop

    with pytest.raises(Stop):
        tiny_user_run(tmp_path, out=tmp_path / "run", on_eval=stop_at_20)
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["step"] == 20
    with pytest.raises(OutputError, match="resume=True"):
        tiny_user_run(tmp_path, out=tmp_path / "run")  # an interrupted run is not started over silently
    resumed = tiny_user_run(tmp_path, out=tmp_path / "run", resume=True)
    assert torch.equal(whole.model.alphas.detach(), resumed.model.alphas.detach())
    for (name, a), b in zip(whole.model.state_dict().items(), resumed.model.state_dict().values()):
        assert torch.equal(a, b), name
    assert whole.genotype.sites == resumed.genotype.sites and whole.losses == resumed.losses
    assert autoln.SiteGenotype.load(tmp_path / "run" / "genotype.json").sites == whole.genotype.sites


def test_autoln_search_writes_tensorboard_events_when_asked(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    outcome = tiny_user_run(tmp_path, out=tmp_path / "tb", tensorboard=True)
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "search/tau", "monitor/mean_entropy", "alpha/blocks.0/pre", "selection/blocks.1/post"} <= tags
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(10, 41, 10))
    assert (tmp_path / "tb" / "alphas.png").is_file()
    assert outcome.genotype.provenance["selection"] == "perturbation"


def test_autoln_search_without_a_folder_writes_nothing_and_refuses_tensorboard(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="out="):
        tiny_user_run(tmp_path, tensorboard=True)
    with pytest.raises(ValueError, match="out="):
        tiny_user_run(tmp_path, resume=True)
    outcome = tiny_user_run(tmp_path)
    assert len(outcome.losses) == 40 and list(tmp_path.iterdir()) == []


def test_search_model_groups_tie_sites_to_one_row_and_refuse_what_does_not_cover_the_sites(tiny_model_cfg):
    cands = ["pre", "post", "deepnorm"]
    lm = TransformerLM(tiny_model_cfg, 11, [(cands, cands)] * tiny_model_cfg.n_layers)
    names = [f"blocks.{i}.{s}_site" for i in range(tiny_model_cfg.n_layers) for s in ("attn", "ffn")]
    pairs = [names[2 * i:2 * i + 2] for i in range(tiny_model_cfg.n_layers)]
    tied = SearchModel(lm, groups=pairs)
    assert tied.site_names == ["blocks.0", "blocks.1", "blocks.2"] and tuple(tied.alphas.shape) == (3, 3)
    mix = tied.mixing_weights()
    assert tuple(mix.shape) == (6, 3) and torch.equal(mix[0], mix[1]) and torch.equal(mix[4], mix[5])
    assert tied.expand(["a", "b", "c"]) == ["a", "a", "b", "b", "c", "c"]
    with pytest.raises(ValueError, match="in no group"):
        SearchModel(lm, groups=pairs[:2])
    with pytest.raises(ValueError, match="in two groups"):
        SearchModel(lm, groups=[*pairs, [names[0]]])
    with pytest.raises(ValueError, match="not a searchable site"):
        SearchModel(lm, groups=[*pairs, ["blocks.9.attn_site"]])
    with pytest.raises(ValueError, match="module order"):
        SearchModel(lm, groups=pairs[::-1])


@pytest.mark.parametrize("kwargs, message", [
    ({"train_batches": []}, "gave 0 batches, expected at least 2"),
    ({"train_batches": "one"}, "gave 1 batch, expected at least 2"),
    ({"train_batches": "tensors"}, "batch 0 is a Tensor, expected an"),
    ({"train_batches": 3}, "expected a list, a DataLoader or a generator"),
    ({"valid_batches": []}, "valid_batches gave 0 batches"),
    ({"selection_batches": []}, "selection_batches gave 0 batches"),
    ({"steps": 2.5}, "steps: expected a positive integer"),
    ({"steps": 0}, "steps: expected a positive integer"),
    ({"seed": None}, "seed: expected an integer"),
    ({"checkpoint_every": -1}, "checkpoint_every: expected an integer >= 0"),
    ({"resume": True, "out": "missing"}, "does not exist"),
    ({"out": "afile"}, "exists and is not a folder"),
    ({"cfg": "tight"}, "autoln.search: cfg: search.warmup_steps"),
])
def test_autoln_search_refuses_bad_input_in_one_line_before_any_step(tmp_path, kwargs, message):
    from autoln.config import SearchConfig
    from autoln.core.errors import AutolnError

    cfg = load_config(TINY, [])
    corpus = load_corpus(cfg.data)
    model = autoln_model_as_user_model(cfg, corpus)
    weights, _, _ = api_batches(cfg, corpus)
    batches = [next(iter(weights)) for _ in range(4)]
    (tmp_path / "afile").write_text("x")
    special = {"one": batches[:1], "tensors": [x for x, _ in batches], "tight": SearchConfig(),
               "missing": str(tmp_path / "missing"), "afile": str(tmp_path / "afile")}
    args = {"train_batches": batches, "steps": 20, **{k: special.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}}
    before = model.alphas.detach().clone()
    with pytest.raises((ValueError, AutolnError)) as info:
        autoln.search(model, args.pop("train_batches"), progress=False, **args)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert torch.equal(model.alphas.detach(), before) and not (tmp_path / "missing").exists()


def test_an_interrupted_autoln_search_names_the_call_that_continues_it(tmp_path):
    import signal

    from autoln.engine.checkpoint import Interrupted

    def term_at_20(step, metrics):
        if step == 20:
            signal.raise_signal(signal.SIGTERM)  # as a scheduler ends a job: the step ends, a checkpoint is written

    with pytest.raises(Interrupted) as info:
        tiny_user_run(tmp_path, out=tmp_path / "run", on_eval=term_at_20)
    assert f"out={str(tmp_path / 'run')!r}, resume=True" in str(info.value)
    assert tiny_user_run(tmp_path, out=tmp_path / "run", resume=True).genotype.sites == tiny_user_run(tmp_path).genotype.sites
