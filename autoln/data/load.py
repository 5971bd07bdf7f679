"""The corpus of a config, read and tokenised once (:func:`load_corpus`).

- Token arrays are cached on disk as ``.npy`` and opened as memory maps, keyed by the corpus
  fingerprint (SHA-256 of its bytes) and the tokeniser.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

import numpy as np

from autoln.config import DataConfig
from autoln.core.errors import DataError
from autoln.core.io import save_numpy_atomic, write_json_atomic
from autoln.core.locks import build_lock
from autoln.data.corpus import SPLITS, Corpus, read_splits
from autoln.data.tokens import _decode, bpe_tokenizer, cache_note, encode_bpe, read_token_files, tokenize

CACHE_VERSION = 1


def _cache_root(cfg: DataConfig) -> Path:
    if cfg.cache_dir:
        return Path(cfg.cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "autoln"


def load_corpus(cfg: DataConfig) -> Corpus:
    """Read, tokenise (or open from the cache) and return the corpus of ``cfg``.

    The cache entry is ``<cache_dir>/<key>/{train,valid,test}.npy`` plus ``meta.json``, with
    ``key`` a hash of the corpus fingerprint, tokeniser and split fractions; arrays are
    written atomically (flushed to disk, ``meta.json`` last) and opened with ``mmap_mode="r"``.
    An entry that fails its checks (unreadable, empty or cut-short arrays, arrays that are not of
    integers (each ``.npy`` header names its dtype), lengths other than ``meta.json`` records,
    token ids outside the vocabulary, negative ones included) is rebuilt. An unwritable cache folder only
    disables caching.

    Raises:
        DataError: as :func:`read_splits` and :func:`tokenize`.
    """
    path = Path(cfg.corpus).expanduser()
    if cfg.corpus != "stdlib" and path.is_dir() and (path / "train.bin").is_file():
        return read_token_files(cfg, path)
    if cfg.tokenizer == "tokens":
        raise DataError(f"data.tokenizer=tokens reads a folder of nanoGPT token files (train.bin, val.bin); "
                        f"data.corpus={cfg.corpus} is not one (text takes bytes, chars, words or bpe)")
    raw, sources = read_splits(cfg)
    h = hashlib.sha256()
    for split in SPLITS:
        h.update(raw[split])
    fingerprint = h.hexdigest()
    settings: list = [CACHE_VERSION, fingerprint, cfg.tokenizer, cfg.valid_fraction, cfg.test_fraction]
    if cfg.tokenizer == "bpe":
        tokenizer_file = None
        if cfg.tokenizer_file:
            try:
                tokenizer_file = hashlib.sha256(Path(cfg.tokenizer_file).expanduser().read_bytes()).hexdigest()
            except OSError as exc:
                raise DataError(f"data.tokenizer_file {cfg.tokenizer_file}: {exc.strerror or exc}") from None
        settings += [cfg.bpe_vocab_size, tokenizer_file]
    key = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:24]
    folder = _cache_root(cfg) / key
    cached = _cached(folder, cfg, fingerprint, sources)
    if cached is not None:
        return cached
    with build_lock(folder.parent / f"{key}.lock"):  # one process builds a new entry; the others wait, then read it
        return _cached(folder, cfg, fingerprint, sources) or _build(raw, sources, folder, cfg, fingerprint)


def _cached(folder: Path, cfg: DataConfig, fingerprint: str, sources: dict[str, str]) -> Optional[Corpus]:
    """The cache entry in ``folder`` when it passes its checks (see :func:`load_corpus`), else None."""
    meta_path = folder / "meta.json"
    if meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            splits = {s: np.load(folder / f"{s}.npy", mmap_mode="r") for s in SPLITS}
            vocab = meta["vocab"]
            if meta["fingerprint"] == fingerprint and meta["vocab_size"] == (256 if vocab is None else len(vocab)) \
                    and all(a.ndim == 1 and a.dtype.kind in "ui" and len(a) == meta["lengths"][s] for s, a in splits.items()) \
                    and all(int(a.max(initial=0)) < meta["vocab_size"] and (a.dtype.kind == "u" or int(a.min(initial=0)) >= 0)
                            for a in splits.values()):
                return Corpus(cfg.corpus, cfg.tokenizer, fingerprint, meta["vocab_size"], vocab, splits, sources,
                              {k: float(v) for k, v in meta["bytes_per_token"].items()})
        except Exception:  # noqa: BLE001 - any damage (an empty .npy raises EOFError, a cut one ValueError...) rebuilds it
            pass
    return None


def _build(raw: dict[str, bytes], sources: dict[str, str], folder: Path, cfg: DataConfig, fingerprint: str) -> Corpus:
    """Tokenise ``raw`` and write the cache entry ``folder`` (arrays first, ``meta.json`` last,
    each atomically); an unwritable cache only disables caching."""
    meta_path = folder / "meta.json"
    if cfg.tokenizer == "bpe":
        splits, vocab = encode_bpe(bpe_tokenizer(cfg, _decode({"train": raw["train"]}, sources)["train"], folder), raw, sources)
    else:
        splits, vocab = tokenize(raw, cfg.tokenizer, sources)
    vocab_size = 256 if vocab is None else len(vocab)
    bytes_per_token = {s: len(raw[s]) / max(1, len(a)) for s, a in splits.items()}
    try:
        for split, arr in splits.items():
            save_numpy_atomic(arr, folder / f"{split}.npy")
        write_json_atomic(meta_path, {"vocab_size": vocab_size, "vocab": vocab, "tokenizer": cfg.tokenizer, "fingerprint": fingerprint,
                                      "lengths": {s: int(len(a)) for s, a in splits.items()}, "bytes_per_token": bytes_per_token})
        splits = {s: np.load(folder / f"{s}.npy", mmap_mode="r") for s in SPLITS}
    except OSError as exc:
        cache_note(exc, folder)  # caching is an optimisation; the in-memory arrays serve
    return Corpus(cfg.corpus, cfg.tokenizer, fingerprint, vocab_size, vocab, splits, sources, bytes_per_token)
