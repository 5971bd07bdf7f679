"""The width of nanoGPT-layout token files (train.bin, val.bin, meta.pkl) is read, not assumed:
uint16 as nanoGPT writes them, uint32 as projects with vocabularies above 65,536 write them,
chosen by data.token_dtype and meta.pkl (autoln.data.token_width's table) and checked against
each file; and the token cache's arrays are checked to be integer ids."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np
import pytest

from autoln import cli
from autoln.config import DataConfig, load_config
from autoln.data import load_corpus
from autoln.core.errors import ConfigError, DataError

from .conftest import ROOT

TINY = str(ROOT / "configs" / "tiny.yaml")
BIG_VOCAB = 100277  # tiktoken's cl100k_base


def token_folder(tmp_path: Path, train, val, meta=None, dtype=np.uint32, name: str = "tok") -> Path:
    """A folder of train.bin / val.bin written in ``dtype`` (little-endian) and, if given, meta.pkl."""
    folder = tmp_path / name
    folder.mkdir()
    np.asarray(train, dtype=np.dtype(dtype).newbyteorder("<")).tofile(folder / "train.bin")
    np.asarray(val, dtype=np.dtype(dtype).newbyteorder("<")).tofile(folder / "val.bin")
    if meta is not None:
        with open(folder / "meta.pkl", "wb") as fh:
            pickle.dump(meta, fh)
    return folder


def big_ids(n: int, seed: int, vocab: int = BIG_VOCAB) -> np.ndarray:
    """``n`` ids below ``vocab``, many of them above 65,535 (whose uint16 halves are both nonzero)."""
    return np.random.default_rng(seed).integers(0, vocab, n)


def refusal(folder: Path, **data) -> str:
    """The one-line DataError of reading ``folder`` with ``data.*`` keys ``data``."""
    with pytest.raises(DataError) as err:
        load_corpus(DataConfig(corpus=str(folder), tokenizer="tokens", **data))
    message = str(err.value)
    assert "\n" not in message
    return message


def test_uint32_files_of_a_large_vocabulary_give_their_exact_tokens(tmp_path):
    """The bug: 40,000 uint32 tokens with meta.pkl's vocab_size 100277 (no dtype) were read as
    80,000 uint16 tokens, every other one a high half-word, and no id out of range. Under
    data.token_dtype=auto a vocabulary above 65,536 means uint32."""
    train, val = big_ids(40_000, 0), big_ids(10_000, 1)
    assert (train > 65535).sum() > 10_000
    folder = token_folder(tmp_path, train, val, {"vocab_size": BIG_VOCAB})
    cfg = load_config(None, [f"data.corpus={folder}"])
    assert cfg.data.tokenizer == "tokens"
    c = load_corpus(cfg.data)
    assert c.vocab_size == BIG_VOCAB
    assert {s: len(a) for s, a in c.splits.items()} == {"train": 40_000, "valid": 5_000, "test": 5_000}
    assert cfg.data.token_dtype == "auto"
    np.testing.assert_array_equal(c.splits["train"], train)
    np.testing.assert_array_equal(c.splits["valid"], val[:5_000])
    np.testing.assert_array_equal(c.splits["test"], val[5_000:])
    assert int(c.splits["train"].max()) == int(train.max()) > 65535
    assert "tokens: train 40,000, valid 5,000, test 5,000" in c.describe()
    assert c.sources["train"].endswith("train.bin (uint32)")


@pytest.mark.parametrize("form", ["str", "numpy-type", "numpy-dtype"])
def test_meta_pkl_dtype_gives_the_width(tmp_path, form):
    """A meta.pkl that records its dtype (as a string, np.uint32 or np.dtype) is read at that
    width, also for a vocabulary that would fit uint16 (Llama 2's 32,000)."""
    dtype = {"str": "uint32", "numpy-type": np.uint32, "numpy-dtype": np.dtype("uint32")}[form]
    train, val = big_ids(3_000, 2, 32_000), big_ids(1_000, 3, 32_000)
    folder = token_folder(tmp_path, train, val, {"vocab_size": 32_000, "dtype": dtype})
    c = load_corpus(DataConfig(corpus=str(folder), tokenizer="tokens"))
    assert [len(c.splits[s]) for s in ("train", "valid", "test")] == [3_000, 500, 500]
    np.testing.assert_array_equal(c.splits["train"], train)


def test_data_token_dtype_uint32_reads_uint32_files(tmp_path):
    """data.token_dtype=uint32 (--set, or DataConfig) reads uint32 files whose meta.pkl has no
    dtype, and without meta.pkl with data.vocab_size; the vocabulary's names (itos) are kept."""
    train, val = big_ids(4_000, 4, 32_000), big_ids(2_000, 5, 32_000)
    itos = {i: f"t{i}" for i in range(32_000)}
    folder = token_folder(tmp_path, train, val, {"vocab_size": 32_000, "itos": itos, "stoi": {v: k for k, v in itos.items()}})
    cfg = load_config(None, [f"data.corpus={folder}", "data.token_dtype=uint32"])
    c = load_corpus(cfg.data)
    assert [len(c.splits[s]) for s in ("train", "valid", "test")] == [4_000, 1_000, 1_000]
    np.testing.assert_array_equal(c.splits["test"], val[1_000:])
    assert c.vocab[31_999] == "t31999"
    (folder / "meta.pkl").unlink()
    c = load_corpus(DataConfig(corpus=str(folder), tokenizer="tokens", vocab_size=32_000, token_dtype="uint32"))
    assert len(c.splits["train"]) == 4_000 and int(c.splits["train"][17]) == int(train[17])


def test_data_token_dtype_is_validated_and_documented():
    with pytest.raises(ConfigError, match=r"data.token_dtype must be one of \['auto', 'uint16', 'uint32'\], got 'int32'"):
        load_config(None, ["data.token_dtype=int32"])
    assert "| `data.token_dtype` | `auto` |" in (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")


#: autoln.data.token_width's table: (data.token_dtype, meta.pkl's dtype, vocabulary) -> the width,
#: or the part of the refusal that says why.
WIDTH_TABLE = [
    ("uint16", None, 65, "uint16"),
    ("uint32", None, 65, "uint32"),
    ("uint16", "uint16", 50_257, "uint16"),
    ("uint32", "uint32", BIG_VOCAB, "uint32"),
    ("uint32", "uint16", 65, "dtype uint16 contradicts data.token_dtype=uint32"),
    ("uint16", "uint32", 65, "dtype uint32 contradicts data.token_dtype=uint16"),
    ("auto", "uint16", 50_257, "uint16"),
    ("auto", "uint32", 32_000, "uint32"),
    ("auto", None, 65, "uint16"),
    ("auto", None, 65_536, "uint16"),
    ("auto", None, 65_537, "uint32"),
    ("auto", None, BIG_VOCAB, "uint32"),
    ("uint16", None, BIG_VOCAB, "uint16 ids (data.token_dtype=uint16) cannot hold a vocabulary of 100,277"),
    ("auto", "uint16", BIG_VOCAB, "uint16 ids (meta.pkl's dtype) cannot hold a vocabulary of 100,277"),
    ("auto", None, (1 << 32) + 1, "uint32 ids (data.token_dtype=auto, vocabulary 4,294,967,297 > 65,536) cannot hold"),
]


@pytest.mark.parametrize("setting, meta_dtype, vocab, expected", WIDTH_TABLE)
def test_the_width_table(tmp_path, setting, meta_dtype, vocab, expected):
    from autoln.data import token_width

    meta = tmp_path / "meta.pkl"
    if expected in ("uint16", "uint32"):
        assert token_width(setting, meta_dtype, vocab, "meta.pkl", meta)[0] == expected
    else:
        with pytest.raises(DataError) as err:
            token_width(setting, meta_dtype, vocab, "meta.pkl", meta)
        assert str(err.value).startswith(str(meta)) and expected in str(err.value)


@pytest.mark.parametrize("setting, meta_dtype, vocab, expected", [row for row in WIDTH_TABLE if row[2] < 1 << 20])
def test_the_width_table_end_to_end(tmp_path, setting, meta_dtype, vocab, expected):
    """Each row of the table through load_corpus, with files written in the row's width (uint32
    for the refused rows): the exact tokens come back, or one line names the file."""
    width = expected if expected in ("uint16", "uint32") else "uint32"
    train, val = big_ids(3_000, 6, vocab), big_ids(800, 7, vocab)
    meta = {"vocab_size": vocab, **({"dtype": meta_dtype} if meta_dtype else {})}
    folder = token_folder(tmp_path, train, val, meta, dtype=width)
    if expected in ("uint16", "uint32"):
        c = load_corpus(DataConfig(corpus=str(folder), tokenizer="tokens", token_dtype=setting))
        assert [len(c.splits[s]) for s in ("train", "valid", "test")] == [3_000, 400, 400]
        np.testing.assert_array_equal(c.splits["train"], train)
    else:
        message = refusal(folder, token_dtype=setting)
        assert expected in message and "meta.pkl" in message


@pytest.mark.parametrize("case, message", [
    ("uint16-for-big-vocab", "tok/meta.pkl: uint16 ids (data.token_dtype=uint16) cannot hold a vocabulary of 100,277 "
                             "(meta.pkl; uint16 holds 65,536 ids): set data.token_dtype=uint32 (or auto)"),
    ("uint16-for-big-data-vocab", "tok/train.bin: uint16 ids (data.token_dtype=uint16) cannot hold a vocabulary of 100,277 "
                                  "(data.vocab_size;"),
    ("not-whole-uint32", "tok/train.bin: 160002 bytes is not a whole, non-zero number of uint32 tokens "
                         "(4 bytes each; data.token_dtype=auto, vocabulary 100,277 > 65,536)"),
    ("meta-contradicts", "tok/meta.pkl: dtype uint16 contradicts data.token_dtype=uint32"),
    ("meta-int64", "tok/meta.pkl: dtype 'int64' is not a width autoln reads (uint16 or uint32, little-endian)"),
    ("meta-nonsense", "tok/meta.pkl: dtype 'tokens' is not a width autoln reads"),
    ("uint32-read-as-uint16", "tok/train.bin: read as uint16 (data.token_dtype=auto, vocabulary 32,000 <= 65,536), every "
                              "second id is 0: the file holds uint32 ids; set data.token_dtype=uint32"),
    ("int64-read-as-uint16", "tok/train.bin: read as uint16 (data.token_dtype=auto, vocabulary 32,000 <= 65,536), every "
                             "second id is 0: the file holds 64-bit ids; autoln reads uint16 or uint32"),
    ("int64-read-as-uint32", "tok/train.bin: read as uint32 (data.token_dtype=uint32), every second id is 0: the file "
                             "holds 64-bit ids"),
    ("uint16-read-as-uint32", "tok/train.bin: token id"),
    ("llmc-header", "tok/train.bin: starts with llm.c's shard header (magic 20240520)"),
    ("itos-short", "tok/meta.pkl: itos must name each id 0 .. 99 once (vocab_size 100); it holds 99 entries"),
    ("vocab-not-int", "tok/meta.pkl: vocab_size must be a positive integer, got '65'"),
    ("meta-not-dict", "tok/meta.pkl: not a readable nanoGPT meta.pkl with a vocab_size (a dict with the key vocab_size; got list)"),
])
def test_a_width_that_does_not_fit_is_refused_in_one_line_naming_the_file(tmp_path, case, message):
    setting, vocab_size = "auto", None
    train, val, meta, dtype = big_ids(40_000, 8), big_ids(1_000, 9), {"vocab_size": BIG_VOCAB}, np.uint32
    if case == "uint16-for-big-vocab":
        setting = "uint16"
    elif case == "uint16-for-big-data-vocab":
        setting, meta, vocab_size = "uint16", None, BIG_VOCAB
    elif case == "meta-contradicts":
        setting, meta = "uint32", {"vocab_size": BIG_VOCAB, "dtype": "uint16"}
    elif case == "meta-int64":
        meta = {"vocab_size": BIG_VOCAB, "dtype": "int64"}
    elif case == "meta-nonsense":
        meta = {"vocab_size": BIG_VOCAB, "dtype": "tokens"}
    elif case in ("uint32-read-as-uint16", "int64-read-as-uint16"):
        train, val, meta = big_ids(4_000, 8, 32_000), big_ids(1_000, 9, 32_000), {"vocab_size": 32_000}
        dtype = np.uint32 if case == "uint32-read-as-uint16" else np.int64
    elif case == "int64-read-as-uint32":
        setting, dtype = "uint32", np.int64
    elif case == "uint16-read-as-uint32":  # GPT-2 ids in uint16 with a vocabulary said to be 100,277: pairs read as one id
        train, val, dtype = big_ids(4_000, 8, 50_257), big_ids(1_000, 9, 50_257), np.uint16
    elif case == "itos-short":
        train, val, meta = train % 100, val % 100, {"vocab_size": 100, "itos": {i: str(i) for i in range(99)}}
    elif case == "vocab-not-int":
        meta = {"vocab_size": "65"}
    elif case == "meta-not-dict":
        meta = [BIG_VOCAB]
    folder = token_folder(tmp_path, train, val, meta, dtype=dtype)
    if case == "not-whole-uint32":
        with open(folder / "train.bin", "ab") as fh:
            fh.write(b"\x00\x00")
    if case == "llmc-header":
        header = np.zeros(256, dtype="<i4")
        header[:3] = [20240520, 2, 40_000]
        (folder / "train.bin").write_bytes(header.tobytes() + train.astype("<u4").tobytes())
    got = refusal(folder, token_dtype=setting, vocab_size=vocab_size)
    assert message in got, got
    if case == "uint16-read-as-uint32":
        assert "is outside the vocabulary of 100277 (data.vocab_size or meta.pkl; ids read as uint32: data.token_dtype=auto, " \
               "vocabulary 100,277 > 65,536)" in got


def test_the_search_command_refuses_a_misfit_width_with_exit_2_and_one_line(tmp_path, capsys):
    """Through search.py's entry point: exit status 2, one line ``error: ...`` naming the file,
    and no run folder (bad input is refused before anything is written)."""
    folder = token_folder(tmp_path, big_ids(4_000, 10, 32_000), big_ids(1_000, 11, 32_000), {"vocab_size": 32_000})
    out = tmp_path / "run"
    code = cli.search_main(["--config", TINY, "--set", "race.enabled=false", "--set", f"data.corpus={folder}", "--set", f"data.cache_dir={tmp_path / 'c'}",
                            "--set", "logging.progress=false", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not out.exists()
    assert err[0].startswith(f"error: {folder / 'train.bin'}: read as uint16") and "set data.token_dtype=uint32" in err[0]


def test_a_uint16_folder_keeps_its_fingerprint_and_a_uint32_one_is_another_corpus(tmp_path):
    """The run's identity: a nanoGPT (uint16) folder's fingerprint is the one autoln always gave
    it (each file's size, first and last MiB), so existing runs and genotypes still match; the
    same bytes read as uint32 are another corpus, with another fingerprint."""
    ids = np.random.default_rng(12).integers(0, 50_000, 8_000)
    folder = token_folder(tmp_path, ids, ids[:2_000], {"vocab_size": 65_536}, dtype=np.uint16)
    h = hashlib.sha256()
    for name in ("train.bin", "val.bin"):
        blob = (folder / name).read_bytes()
        h.update(str(len(blob)).encode())
        h.update(blob[: 1 << 20])
        h.update(blob[max(0, len(blob) - (1 << 20)):][: 1 << 20])
    c16 = load_corpus(DataConfig(corpus=str(folder), tokenizer="tokens"))
    assert c16.fingerprint == h.hexdigest() and len(c16.splits["train"]) == 8_000
    c32 = load_corpus(DataConfig(corpus=str(folder), tokenizer="tokens", token_dtype="uint32", vocab_size=1 << 32))
    assert len(c32.splits["train"]) == 4_000 and c32.fingerprint != c16.fingerprint


def test_a_cache_entry_of_non_integer_ids_is_rebuilt(tmp_path, cache_dir):
    """The token cache's arrays are read back through their .npy headers: an entry whose array
    holds floats (or negative ids), at the right length and below the vocabulary, is rebuilt
    rather than served."""
    f = tmp_path / "t.txt"
    f.write_text("".join(f"line {i:04d}\n" for i in range(1000)))
    cfg = DataConfig(corpus=str(f), cache_dir=cache_dir)
    want = {s: np.asarray(a).copy() for s, a in load_corpus(cfg).splits.items()}
    (entry,) = [p for p in Path(cache_dir).iterdir() if p.is_dir()]
    np.save(entry / "test.npy", want["test"].astype(np.float32) + 0.5)
    negative = want["valid"].astype(np.int32)
    negative[0] = -1
    np.save(entry / "valid.npy", negative)
    again = load_corpus(cfg)
    for split, arr in want.items():
        assert again.splits[split].dtype == arr.dtype
        np.testing.assert_array_equal(np.asarray(again.splits[split]), arr)


def test_a_retrain_on_uint32_files_runs_on_their_exact_tokens(tmp_path, capsys):
    """End to end: retrain.py (tiny config, 4 steps) on 40,000 uint32 tokens of a 100,277-token
    vocabulary trains on exactly them, prints their counts and records data.token_dtype."""
    import yaml

    folder = token_folder(tmp_path, big_ids(40_000, 13), big_ids(10_000, 14), {"vocab_size": BIG_VOCAB})
    out = tmp_path / "run"
    code = cli.retrain_main(["--config", TINY, "--genotype", "all-pre", "--out", str(out)] + [
        a for kv in (f"data.corpus={folder}", f"data.cache_dir={tmp_path / 'c'}", "retrain.steps=4", "retrain.warmup_steps=1",
                     "retrain.eval_every=2", "retrain.eval_windows=2", "retrain.final_eval_windows=2", "logging.progress=false")
        for a in ("--set", kv)])
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    assert code == 0 and (out / "metrics.json").is_file()
    assert "(tokens, vocab 100,277; tokens: train 40,000, valid 5,000, test 5,000)" in printed
    assert yaml.safe_load((out / "config.yaml").read_text())["data"]["token_dtype"] == "auto"
