"""Corpora, tokenisers, splits and samplers (docs/design.md §8, §4)."""

import sys
import types

import numpy as np
import pytest

from autoln.config import DataConfig
from autoln.data import (WindowSampler, arch_split, check_lengths, eval_starts, load_corpus, metrics_from_loss,
                         stdlib_files, tokenize, windows)
from autoln.core.errors import DataError

from .conftest import shared_path


def test_d_w_and_d_alpha_share_no_window():
    n, ctx = 50_000, 16
    w, a = arch_split(n, ctx, 512, 0.5, seed=3)
    assert len(w) + len(a) == n // 512 and abs(len(w) - len(a)) <= 1
    cover = np.zeros(n, dtype=int)
    for lo, hi in np.concatenate([w, a]):
        cover[lo:hi] += 1
    assert cover.max() == 1  # chunks are disjoint
    tokens = np.arange(n)
    for chunks, seed in ((w, 1), (a, 2)):
        s = WindowSampler(tokens, chunks, ctx, batch_size=64, seed=seed)
        for _ in range(20):
            starts = s.sample_starts()
            inside = ((starts[:, None] >= chunks[:, 0]) & (starts[:, None] + ctx + 1 <= chunks[:, 1])).any(1)
            assert inside.all()
    own_w = np.zeros(n, bool)
    for lo, hi in w:
        own_w[lo:hi] = True
    s_a = WindowSampler(tokens, a, ctx, batch_size=256, seed=5)
    for _ in range(10):
        for st in s_a.sample_starts():
            assert not own_w[st:st + ctx + 1].any()


def test_sampler_is_seeded_and_windows_shift_by_one():
    tokens = np.arange(1000)
    chunks = np.array([[0, 1000]])
    a = WindowSampler(tokens, chunks, 10, 4, seed=[7, 1]).sample()
    b = WindowSampler(tokens, chunks, 10, 4, seed=[7, 1]).sample()
    assert all(np.array_equal(u, v) for u, v in zip(a, b))
    x, y = a
    assert x.shape == (4, 10) and (y - x == 1).all()
    x, y = windows(tokens, np.array([3]), 5)
    assert x.tolist() == [[3, 4, 5, 6, 7]] and y.tolist() == [[4, 5, 6, 7, 8]]


def test_eval_starts_non_overlapping():
    assert eval_starts(101, 10, None).tolist() == list(range(0, 100, 10))
    s = eval_starts(10_001, 10, 5)
    assert s.tolist() == [0, 2500, 5000, 7490, 9990] and (np.diff(s) >= 10).all()


def test_single_file_splits_at_line_ends(tmp_path, cache_dir):
    f = tmp_path / "t.txt"
    f.write_text("".join(f"line {i:04d}\n" for i in range(1000)))
    c = load_corpus(DataConfig(corpus=str(f), cache_dir=cache_dir))
    parts = [bytes(np.asarray(c.splits[s])) for s in ("train", "valid", "test")]
    assert b"".join(parts) == f.read_bytes()
    assert all(p.endswith(b"\n") for p in parts)
    assert [len(p) // 10 for p in parts] == [900, 50, 50]
    assert c.vocab_size == 256 and c.vocab is None
    again = load_corpus(DataConfig(corpus=str(f), cache_dir=cache_dir))
    assert isinstance(again.splits["train"], np.memmap) and again.fingerprint == c.fingerprint


def test_words_and_chars_tokenisers():
    raw = {"train": b"a b a\n\nc\n", "valid": b"a z\n", "test": b"b\n"}
    src = {k: k for k in raw}
    ids, vocab = tokenize(raw, "words", src)
    assert vocab == ["a", "b", "<eos>", "c", "<unk>"]
    assert ids["train"].tolist() == [0, 1, 0, 2, 2, 3, 2]
    assert ids["valid"].tolist() == [0, 4, 2] and ids["test"].tolist() == [1, 2]
    ids, vocab = tokenize({"train": "ab\né".encode(), "valid": b"ba", "test": b"q"}, "chars", src)
    assert vocab == ["\n", "a", "b", "é", "<unk>"] and ids["test"].tolist() == [4]
    with pytest.raises(DataError, match=r"valid.*UTF-8 at byte 1"):
        tokenize({"train": b"ok", "valid": b"a\xff", "test": b"x"}, "chars", src)


def test_bad_corpora(tmp_path, cache_dir):
    with pytest.raises(DataError, match="does not exist"):
        load_corpus(DataConfig(corpus=str(tmp_path / "nope.txt"), cache_dir=cache_dir))
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(DataError, match="empty"):
        load_corpus(DataConfig(corpus=str(empty), cache_dir=cache_dir))
    folder = tmp_path / "wt"
    folder.mkdir()
    (folder / "train.txt").write_text("x\n")
    with pytest.raises(DataError, match="valid.txt"):
        load_corpus(DataConfig(corpus=str(folder), cache_dir=cache_dir))
    short = tmp_path / "short.txt"
    short.write_text("".join(f"{i}\n" for i in range(40)))
    c = load_corpus(DataConfig(corpus=str(short), cache_dir=cache_dir))
    with pytest.raises(DataError, match="model.context=64"):
        check_lengths(c, 64)


def test_stdlib_corpus_is_ordered_and_fingerprinted(cache_dir):
    files = stdlib_files()
    assert len(files) > 100 and all(p.suffix == ".py" for p in files)
    assert not any("site-packages" in p.parts for p in files)
    c = load_corpus(DataConfig(cache_dir=cache_dir))
    assert c.vocab_size == 256 and len(c.fingerprint) == 64
    total = sum(len(v) for v in c.splits.values())
    assert total == sum(p.stat().st_size for p in files)
    assert load_corpus(DataConfig(cache_dir=cache_dir)).fingerprint == c.fingerprint


def test_metrics_units():
    m = metrics_from_loss(np.log(2.0), "bytes")
    assert m["bits_per_byte"] == pytest.approx(1.0) and m["perplexity"] == pytest.approx(2.0)
    assert "bits_per_byte" not in metrics_from_loss(1.0, "words")
    assert metrics_from_loss(np.log(4.0), "chars")["bits_per_char"] == pytest.approx(2.0)


def test_wikitext2_word_counts_match_sources(cache_dir):
    folder = shared_path("wikitext-2")
    c = load_corpus(DataConfig(corpus=str(folder), tokenizer="words", cache_dir=cache_dir))
    assert [len(c.splits[s]) for s in ("train", "valid", "test")] == [2_088_628, 217_646, 245_569]
    assert c.vocab_size == 33_278 and c.vocab[:3] == ["<eos>", "=", "Valkyria"]


def test_tiny_shakespeare_chars(cache_dir):
    f = shared_path("tinyshakespeare", "input.txt")
    c = load_corpus(DataConfig(corpus=str(f), tokenizer="chars", cache_dir=cache_dir))
    assert sum(len(v) for v in c.splits.values()) == 1_115_394
    assert c.vocab_size <= 66 and c.vocab[0] == "\n"


def test_a_short_name_without_the_hf_extra_names_the_pip_install(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no folder called wikitext-2 here
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DataError) as err:
        load_corpus(DataConfig(corpus="wikitext-2", cache_dir=str(tmp_path / "c")))
    from .conftest import ROOT

    # from another folder than the clone, the clone's path in place of "." (tests/test_remedies.py follows it)
    assert f"install -e '{ROOT}[hf]'" in str(err.value) and "data.corpus=wikitext-2" in str(err.value)


def test_a_short_name_read_through_hf_datasets_is_the_wikitext_folder(monkeypatch, tmp_path):
    """Hugging Face's ``wikitext-2-v1`` rows are the lines of the usual WikiText-2 files (36,718
    train rows = lines of train.txt); joined, they must give the same corpus (same fingerprint,
    same tokens) as the local folder. ``datasets`` is replaced by a stand-in serving those rows."""
    folder = shared_path("wikitext-2")
    calls = []

    def load_dataset(repo, config):
        calls.append((repo, config))
        return {hf: {"text": (folder / f"{ours}.txt").read_text(encoding="utf-8").splitlines(keepends=True)}
                for ours, hf in (("train", "train"), ("valid", "validation"), ("test", "test"))}

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.chdir(tmp_path)
    hf = load_corpus(DataConfig(corpus="wikitext-2", cache_dir=str(tmp_path / "c")))
    local = load_corpus(DataConfig(corpus=str(folder), cache_dir=str(tmp_path / "c")))
    assert calls == [("Salesforce/wikitext", "wikitext-2-v1")]
    assert hf.fingerprint == local.fingerprint and len(hf.splits["train"]) == 10_797_148
    assert hf.sources["valid"] == "Salesforce/wikitext wikitext-2-v1 (validation)"
    (tmp_path / "wikitext-2").mkdir()  # an existing path wins over the short name
    with pytest.raises(DataError, match="missing split file"):
        load_corpus(DataConfig(corpus="wikitext-2", cache_dir=str(tmp_path / "c")))


@pytest.mark.parametrize("damage", ["empty", "cut", "garbage", "shorter", "meta"])
def test_a_damaged_token_cache_is_rebuilt(tmp_path, cache_dir, damage):
    """A cache entry left by a crash or a full disk (an empty or cut-short .npy, garbage, a
    valid array of the wrong length, a garbled meta.json) is rebuilt, never raised."""
    from pathlib import Path

    f = tmp_path / "t.txt"
    f.write_text("".join(f"line {i:04d}\n" for i in range(1000)))
    cfg = DataConfig(corpus=str(f), cache_dir=cache_dir)
    want = {s: np.asarray(a).copy() for s, a in load_corpus(cfg).splits.items()}
    (folder,) = [p for p in Path(cache_dir).iterdir() if p.is_dir()]  # beside it: the build lock
    target = folder / ("meta.json" if damage == "meta" else "test.npy")
    if damage == "empty":
        target.write_bytes(b"")  # `: > test.npy`: np.load raises EOFError
    elif damage == "cut":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "garbage":
        target.write_bytes(b"\x93NUMPY garbage")
    elif damage == "shorter":
        np.save(target, want["test"][:-10])
    else:
        target.write_text("{not json")
    again = load_corpus(cfg)
    for split, arr in want.items():
        np.testing.assert_array_equal(np.asarray(again.splits[split]), arr)
    assert isinstance(load_corpus(cfg).splits["test"], np.memmap)  # the rebuilt entry serves the next run


def test_the_token_cache_is_written_atomically_and_flushed(tmp_path, cache_dir, monkeypatch):
    """Every cache file goes through a flushed temporary file and a rename (no temporary left)."""
    import os
    from pathlib import Path

    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    f = tmp_path / "t.txt"
    f.write_text("".join(f"line {i:04d}\n" for i in range(300)))
    load_corpus(DataConfig(corpus=str(f), cache_dir=cache_dir))
    (folder,) = [p for p in Path(cache_dir).iterdir() if p.is_dir()]  # beside it: the build lock
    assert len(synced) == 4  # train, valid, test, meta.json
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "test.npy", "train.npy", "valid.npy"]


def _token_folder(tmp_path, train, val, meta=None):
    import pickle

    folder = tmp_path / "tok"
    folder.mkdir()
    np.asarray(train, dtype=np.uint16).tofile(folder / "train.bin")
    np.asarray(val, dtype=np.uint16).tofile(folder / "val.bin")
    if meta is not None:
        with open(folder / "meta.pkl", "wb") as fh:
            pickle.dump(meta, fh)
    return folder


def test_nanogpt_token_files_are_read_as_they_are(tmp_path):
    """train.bin / val.bin of uint16 ids (nanoGPT's prepare.py), the vocabulary from meta.pkl or
    data.vocab_size; val.bin's halves are valid and test; data.tokenizer becomes tokens."""
    from autoln.config import load_config

    rng = np.random.default_rng(0)
    train, val = rng.integers(0, 65, 5000), rng.integers(0, 65, 1000)
    folder = _token_folder(tmp_path, train, val, {"vocab_size": 65, "itos": {i: chr(32 + i) for i in range(65)}})
    cfg = load_config(None, [f"data.corpus={folder}"])
    assert cfg.data.tokenizer == "tokens"
    c = load_corpus(cfg.data)
    assert c.vocab_size == 65 and c.vocab[1] == "!" and c.tokenizer == "tokens"
    np.testing.assert_array_equal(c.splits["train"], train)
    np.testing.assert_array_equal(np.concatenate([c.splits["valid"], c.splits["test"]]), val)
    assert len(c.splits["valid"]) == 500 and c.bytes_per_token == {}
    assert metrics_from_loss(1.0, "tokens") == {"loss": 1.0, "perplexity": pytest.approx(np.e)}
    (folder / "meta.pkl").unlink()
    assert load_corpus(DataConfig(corpus=str(folder), tokenizer="tokens", vocab_size=100)).vocab_size == 100


@pytest.mark.parametrize("case, message", [
    ("odd", "train.bin: 10001 bytes is not a whole, non-zero number of uint16 tokens"),
    ("outside", "val.bin: token id 70 at position 3 is outside the vocabulary of 65"),
    ("no-vocab", "the vocabulary size is unknown; set data.vocab_size"),
    ("bad-meta", "meta.pkl: not a readable nanoGPT meta.pkl"),
    ("text-tokenizer", "data.tokenizer must be tokens, not chars"),
])
def test_bad_token_files_are_refused_in_one_line_naming_the_file(tmp_path, case, message):
    meta = None if case == "no-vocab" else {"vocab_size": 65}
    val = [1, 2, 3, 70, 4] if case == "outside" else [1, 2, 3, 4]
    folder = _token_folder(tmp_path, np.arange(5000) % 65, val, meta)
    if case == "odd":
        (folder / "train.bin").write_bytes(b"\x00" * 10001)
    if case == "bad-meta":
        (folder / "meta.pkl").write_bytes(b"not a pickle")
    with pytest.raises(DataError) as err:
        load_corpus(DataConfig(corpus=str(folder), tokenizer="chars" if case == "text-tokenizer" else "tokens"))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_bpe_is_trained_on_train_cached_and_reported_in_bits_per_byte(tmp_path, cache_dir):
    """A byte-level BPE of data.bpe_vocab_size tokens, trained on the training split; the
    cache serves it back; bits per byte = nats per token / ln 2 / bytes per token; a user's
    tokenizer.json gives the same ids; one that does not load is refused naming it."""
    import math
    from pathlib import Path

    from .conftest import ROOT

    text = tmp_path / "t.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    cfg = DataConfig(corpus=str(text), tokenizer="bpe", bpe_vocab_size=400, cache_dir=cache_dir)
    c = load_corpus(cfg)
    assert c.vocab_size == 400 and c.tokenizer == "bpe"
    raw = text.read_bytes()
    assert sum(len(a) for a in c.splits.values()) < 0.8 * len(raw)  # merges: fewer tokens than bytes
    assert c.bytes_per_token["valid"] > 1.2
    again = load_corpus(cfg)
    assert isinstance(again.splits["train"], np.memmap) and again.bytes_per_token == pytest.approx(c.bytes_per_token)
    np.testing.assert_array_equal(np.asarray(again.splits["valid"]), np.asarray(c.splits["valid"]))
    m = metrics_from_loss(2.0, "bpe", c.bytes_per_token["valid"])
    assert m["bits_per_byte"] == pytest.approx(2.0 / math.log(2) / c.bytes_per_token["valid"])
    (trained,) = Path(cache_dir).glob("*/tokenizer.json")
    mine = load_corpus(DataConfig(corpus=str(text), tokenizer="bpe", tokenizer_file=str(trained), cache_dir=str(tmp_path / "c2")))
    np.testing.assert_array_equal(np.asarray(mine.splits["test"]), np.asarray(c.splits["test"]))
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{}")
    with pytest.raises(DataError, match=f"data.tokenizer_file {broken}: not a loadable Hugging Face tokenizer.json"):
        load_corpus(DataConfig(corpus=str(text), tokenizer="bpe", tokenizer_file=str(broken), cache_dir=str(tmp_path / "c3")))


@pytest.mark.parametrize("kind", ["tokens", "bpe"])
def test_a_retrain_runs_on_token_files_and_on_bpe(tmp_path, kind):
    """End to end: token files report perplexity (bytes unknown), BPE bits per byte."""
    from autoln.config import load_config
    from autoln.retrain.run_retrain import run_retrain

    from .conftest import ROOT

    if kind == "tokens":
        corpus = _token_folder(tmp_path, np.arange(20000) % 97, np.arange(4000) % 97, {"vocab_size": 97})
        sets = []
    else:
        corpus = tmp_path / "t.txt"
        corpus.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
        sets = ["data.tokenizer=bpe", "data.bpe_vocab_size=300"]
    cfg = load_config(ROOT / "configs" / "tiny.yaml", [f"data.corpus={corpus}", f"data.cache_dir={tmp_path / 'c'}", *sets,
                                                       "retrain.steps=4", "retrain.warmup_steps=1", "retrain.eval_every=2",
                                                       "retrain.final_eval_windows=4", "logging.progress=false", "logging.tensorboard=false"])
    result = run_retrain(cfg, "all-post", tmp_path / "run")
    assert ("bits_per_byte" in result.valid) == (kind == "bpe") and result.valid["perplexity"] > 1
    assert result.model.tok_emb.weight.shape[0] == (97 if kind == "tokens" else 300)


def test_a_binary_file_taken_as_a_corpus_gets_a_warning(tmp_path, cache_dir, capsys):
    from .conftest import ROOT

    binary = tmp_path / "lib.so"
    binary.write_bytes(bytes(range(256)) * 400)
    load_corpus(DataConfig(corpus=str(binary), cache_dir=cache_dir))
    assert "does not look like text" in capsys.readouterr().err
    text = tmp_path / "t.txt"
    text.write_text((ROOT / "README.md").read_text(encoding="utf-8"), encoding="utf-8")
    load_corpus(DataConfig(corpus=str(text), cache_dir=cache_dir))
    assert "does not look like text" not in capsys.readouterr().err
