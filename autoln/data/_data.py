"""Corpora, tokenisers, splits and batch sampling (docs/design.md §8, §4).

- Corpus: ``stdlib`` (the Python standard library's ``*.py`` sources, sorted by relative path,
  read as bytes; needs no download), a single text file (the last ``test_fraction`` is test,
  the ``valid_fraction`` before it valid, both cut at line ends), a folder in the WikiText
  layout (``train.txt``, ``valid.txt``, ``test.txt``), or a WikiText short name of
  :data:`HF_CORPORA` (``wikitext-2`` ...), fetched by Hugging Face ``datasets`` (the optional
  extra ``autoln[hf]``) into its own cache, and read from that cache when offline. An existing
  path always wins over a short name.
- Tokenisers: ``bytes`` (vocabulary 256), ``chars`` (the training split's characters, plus
  ``<unk>`` if valid/test hold others), ``words`` (WikiText-style: whitespace split, ``<eos>``
  after every line, vocabulary from the training split in first-seen order, unseen words ->
  ``<unk>``).
- Token arrays are cached on disk as ``.npy`` and opened as memory maps, keyed by the corpus
  fingerprint (SHA-256 of its bytes) and the tokeniser.
- The training split is cut into chunks; a seeded permutation gives a disjoint D_w (weights)
  and D_alpha (alphas). Every training window lies inside one chunk, so D_w and D_alpha share
  no window. Batches are random windows drawn by persistent seeded samplers.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
import torch

from autoln.core.commands import pip_extra
from autoln.config import DataConfig
from autoln.core.errors import DataError
from autoln.core.io import save_numpy_atomic, write_json_atomic, write_text_atomic
from autoln.core.locks import build_lock

SPLITS = ("train", "valid", "test")
CACHE_VERSION = 1
EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}
#: The headline metric per tokeniser: bits per byte for bytes, bits per character for
#: characters, perplexity for words (docs/design.md §8).
HEADLINE = {"bytes": "bits_per_byte", "chars": "bits_per_char", "words": "perplexity", "bpe": "bits_per_byte",
            "tokens": "perplexity"}
#: The headline metric's unit as progress bars and messages show it.
UNITS = {"bits_per_byte": "bits/byte", "bits_per_char": "bits/char", "perplexity": "perplexity"}
#: ``data.corpus`` short names -> (Hugging Face dataset, config). The ``-v1`` configs are the
#: tokenised WikiText of Merity et al. 2016 (rare words as ``<unk>``), the same files as the
#: usual ``wikitext-2/{train,valid,test}.txt``; ``-raw`` the untokenised text.
HF_CORPORA = {
    "wikitext-2": ("Salesforce/wikitext", "wikitext-2-v1"),
    "wikitext-2-raw": ("Salesforce/wikitext", "wikitext-2-raw-v1"),
    "wikitext-103": ("Salesforce/wikitext", "wikitext-103-v1"),
    "wikitext-103-raw": ("Salesforce/wikitext", "wikitext-103-raw-v1"),
}
#: Hugging Face's split name of each of ours.
HF_SPLITS = {"train": "train", "valid": "validation", "test": "test"}


@dataclass
class Corpus:
    """A tokenised corpus.

    Attributes:
        name: the ``data.corpus`` value; ``tokenizer``: its tokeniser.
        fingerprint: SHA-256 (hex) of the raw bytes of all splits, in split order.
        vocab_size: number of token ids; ``vocab``: id -> string (None for bytes).
        splits: ``{"train", "valid", "test"}`` -> 1-D integer arrays (memory-mapped).
        sources: ``{"train", ...}`` -> a description of where each split came from.
        bytes_per_token: per split, the text's bytes over its tokens (1 for bytes; for BPE what
            turns nats per token into bits per byte); empty when unknown (token files).
    """

    name: str
    tokenizer: str
    fingerprint: str
    vocab_size: int
    vocab: Optional[list[str]]
    splits: dict[str, np.ndarray]
    sources: dict[str, str]
    bytes_per_token: dict[str, float] = field(default_factory=dict)

    def unigram_log_probs(self) -> np.ndarray:
        """Log-probabilities of each token id in the training split, add-one smoothed:
        ``log((count + 1) / (n_train + vocab_size))``, float64 ``(vocab_size,)``. The start of
        the LM head's bias (:meth:`autoln.models.model.TransformerLM.init_output_bias`); its
        cross-entropy is the *unigram plateau*."""
        counts = np.bincount(np.asarray(self.splits["train"]), minlength=self.vocab_size)[: self.vocab_size]
        return np.log((counts + 1.0) / (counts.sum() + self.vocab_size))

    def unigram_plateau(self, split: str = "valid") -> float:
        """The *unigram plateau* of ``split``: the mean cross-entropy, in nats per token, of
        predicting every token of ``split`` by :meth:`unigram_log_probs`, i.e. the loss of a
        model that has learnt the token frequencies and nothing else. Float."""
        return float(-self.unigram_log_probs()[np.asarray(self.splits[split])].mean())

    def describe(self) -> str:
        """One line: name, tokeniser, vocabulary size and tokens per split."""
        sizes = ", ".join(f"{k} {len(v):,}" for k, v in self.splits.items())
        return f"{self.name} ({self.tokenizer}, vocab {self.vocab_size:,}; tokens: {sizes})"


def stdlib_files() -> list[Path]:
    """The default corpus' files: every ``*.py`` under the running Python's stdlib folder,
    except ``site-packages``/``dist-packages``/``__pycache__``, sorted by relative POSIX path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if p.is_file() and not EXCLUDED_DIRS & set(p.relative_to(root).parts)]
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def read_splits(cfg: DataConfig) -> tuple[dict[str, bytes], dict[str, str]]:
    """Raw bytes of the three splits and their source descriptions.

    Raises:
        DataError: missing, unreadable or empty file; missing split file in a WikiText folder;
            a split left empty by the fractions.
    """
    if cfg.corpus == "stdlib":
        files = stdlib_files()
        if not files:
            raise DataError("data.corpus=stdlib: no *.py files found in the Python standard library folder")
        blob = b"".join(p.read_bytes() for p in files)
        return _cut(blob, cfg, "the Python standard library"), {s: f"stdlib ({len(files)} files)" for s in SPLITS}
    path = Path(cfg.corpus).expanduser()
    if cfg.corpus in HF_CORPORA and not path.exists():
        return read_hf(cfg.corpus)
    if path.is_dir():
        out, src = {}, {}
        for split in SPLITS:
            f = path / f"{split}.txt"
            if not f.is_file():
                raise DataError(f"data.corpus={cfg.corpus}: missing split file {f} (a WikiText-layout folder needs train.txt, valid.txt and test.txt)")
            out[split] = _read(f)
            src[split] = str(f)
        return out, src
    if not path.exists():
        raise DataError(f"data.corpus: {cfg.corpus} does not exist (expected 'stdlib', a text file, a WikiText-layout folder "
                        f"or one of {', '.join(HF_CORPORA)})")
    return _cut(_read(path), cfg, str(path)), {s: f"{path} ({s} part)" for s in SPLITS}


def read_hf(name: str) -> tuple[dict[str, bytes], dict[str, str]]:
    """The three splits of the short name ``name`` (:data:`HF_CORPORA`) through Hugging Face
    ``datasets.load_dataset``: each split's rows (one line of the original file each) joined
    into that file's bytes (UTF-8, one ``\n`` per row). ``datasets`` keeps its own cache
    (``HF_HOME``); with ``HF_DATASETS_OFFLINE=1`` it reads only that cache.

    Raises:
        DataError: ``datasets`` is not installed (naming the ``pip install`` to run), or the
            dataset could not be fetched or read (no internet and not in the cache).
    """
    repo, config = HF_CORPORA[name]
    try:
        import datasets
    except ImportError:
        raise DataError(f"data.corpus={name} needs the optional Hugging Face datasets library; run {pip_extra('hf')} "
                        f"(or pass a folder holding train.txt, valid.txt and test.txt)") from None
    try:
        ds = datasets.load_dataset(repo, config)
    except Exception as exc:  # network, cache, hub errors: one line naming what to do
        raise DataError(f"data.corpus={name}: could not load {repo} ({config}) with Hugging Face datasets "
                        f"({type(exc).__name__}: {str(exc)[:200]}); on a machine without internet it must already be in "
                        f"the datasets cache (HF_HOME), or pass a WikiText-layout folder") from None
    out = {}
    for split, hf_split in HF_SPLITS.items():
        rows = ds[hf_split]["text"]
        out[split] = "".join(t if t.endswith("\n") else t + "\n" for t in rows).encode("utf-8")
    return out, {s: f"{repo} {config} ({HF_SPLITS[s]})" for s in SPLITS}


def looks_like_text(blob: bytes, sample: int = 1 << 16) -> bool:
    """True when the first ``sample`` bytes of ``blob`` look like text: no NUL byte and at most
    5 % control bytes other than tab, newline and carriage return (the test of ``file`` and
    git's binary detection, loosened for odd text)."""
    head = blob[:sample]
    if b"\x00" in head:
        return False
    control = sum(1 for b in head if b < 32 and b not in (9, 10, 13)) + head.count(127)
    return control <= 0.05 * max(1, len(head))


def _read(path: Path) -> bytes:
    """The bytes of the corpus file ``path``, with a warning when they do not look like text.

    Raises:
        DataError: unreadable or empty; or one of nanoGPT's token files (a ``.bin`` with
            ``train.bin`` and ``val.bin`` beside it), whose folder is the corpus to pass."""
    import sys

    if path.suffix == ".bin" and (path.parent / "train.bin").is_file() and (path.parent / "val.bin").is_file():
        raise DataError(f"corpus file {path} is one of nanoGPT's token files (train.bin and val.bin are beside it), not text: "
                        f"pass their folder, --set data.corpus={path.parent}, and autoln reads them as token ids")
    try:
        blob = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read corpus file {path}: {exc.strerror or exc}") from None
    if not blob.strip():
        raise DataError(f"corpus file {path} is empty")
    if not looks_like_text(blob):
        print(f"warning: corpus file {path} does not look like text (NUL or control bytes): it is read as bytes all the same, "
              "but a language model of a binary file says little about where a Transformer's norms should go", file=sys.stderr)
    return blob


def _cut(blob: bytes, cfg: DataConfig, where: str) -> dict[str, bytes]:
    """Split one text into train / valid / test at line ends near the configured fractions."""

    def line_end(pos: int) -> int:  # first line boundary at or after pos
        nl = blob.find(b"\n", max(pos - 1, 0))
        return len(blob) if nl < 0 else nl + 1

    n = len(blob)
    a = line_end(int(n * (1 - cfg.valid_fraction - cfg.test_fraction)))
    b = line_end(max(a, int(n * (1 - cfg.test_fraction))))
    parts = {"train": blob[:a], "valid": blob[a:b], "test": blob[b:]}
    for split, part in parts.items():
        if not part:
            raise DataError(f"{where}: the {split} split is empty after cutting at line ends "
                            f"(data.valid_fraction={cfg.valid_fraction}, data.test_fraction={cfg.test_fraction}); "
                            "the text needs more lines")
    return parts


def _decode(raw: dict[str, bytes], sources: dict[str, str]) -> dict[str, str]:
    out = {}
    for split, blob in raw.items():
        try:
            out[split] = blob.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{sources[split]}: not valid UTF-8 at byte {exc.start} ({exc.reason}); "
                            "the chars and words tokenisers need UTF-8 text (data.tokenizer=bytes reads any bytes)") from None
    return out


def _words(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [w for line in lines for w in (*line.split(), "<eos>")]


def tokenize(raw: dict[str, bytes], tokenizer: str, sources: dict[str, str]) -> tuple[dict[str, np.ndarray], Optional[list[str]]]:
    """Token ids per split and the vocabulary (None for bytes).

    Raises:
        DataError: undecodable UTF-8 for ``chars``/``words`` (names the file and byte offset).
    """
    if tokenizer == "bytes":
        return {s: np.frombuffer(b, dtype=np.uint8).copy() for s, b in raw.items()}, None
    text = _decode(raw, sources)
    seqs = {s: (list(t) if tokenizer == "chars" else _words(t)) for s, t in text.items()}
    if tokenizer == "chars":
        vocab = sorted(set(seqs["train"]))
    else:
        vocab = list(dict.fromkeys(seqs["train"]))
    index = {tok: i for i, tok in enumerate(vocab)}
    if any(tok not in index for s in ("valid", "test") for tok in seqs[s]) and "<unk>" not in index:
        index["<unk>"] = len(vocab)
        vocab.append("<unk>")
    unk = index.get("<unk>", -1)
    dtype = np.uint16 if len(vocab) <= 65536 else np.int32
    ids = {s: np.fromiter((index.get(t, unk) for t in seq), dtype=np.int64, count=len(seq)).astype(dtype) for s, seq in seqs.items()}
    return ids, vocab


TOKEN_FILES = ("train.bin", "val.bin")
#: The widths a token file's ids may have (``data.token_dtype``, ``meta.pkl``'s ``dtype``): name ->
#: numpy dtype, little-endian as nanoGPT's ``prepare.py`` writes them on every common machine.
TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
#: The first int32 of an llm.c token shard (``dev/data/data_common.py``: a 1024-byte header of
#: 256 int32, magic 20240520, version, token count, then the ids): not a headerless nanoGPT file.
LLMC_MAGIC = 20240520
#: How much of each token file the width check reads (from its start), in bytes.
WIDTH_SAMPLE = 1 << 20


def token_width(setting: str, meta_dtype: Optional[str], vocab_size: int, vocab_from: str, meta: Path) -> tuple[str, str]:
    """The width of a token folder's ids, and why (for the messages), by this table:

    ====================  =====================  ==============  ================================
    ``data.token_dtype``  ``meta.pkl``'s dtype   vocabulary      read as
    ====================  =====================  ==============  ================================
    uint16 or uint32      absent, or the same    fits the width  that width
    uint16 or uint32      the other width        any             refused: they contradict
    auto                  uint16 or uint32       fits the width  meta.pkl's
    auto                  absent                 <= 65,536       uint16
    auto                  absent                 > 65,536        uint32
    any                   any                    > the width's   refused: ids would not fit
    ====================  =====================  ==============  ================================

    Why ``auto`` picks uint16 up to 65,536 ids: nanoGPT's ``prepare.py`` always writes uint16
    and its ``meta.pkl`` (``vocab_size``, ``itos``, ``stoi``) has no dtype, so that is what a
    nanoGPT folder holds. Above 65,536 ids uint16 cannot be the width (an id of 65,536 or more
    does not fit in it; a file written so has lost its high bits), and uint32 is the narrowest
    width that holds them, the width projects with such vocabularies (tiktoken's 100,277,
    Llama 3's 128,256) write. meta.pkl is absent, or has no ``dtype``, in both rows. A uint32 file of a small vocabulary (Llama 2's 32,000) under
    ``auto`` is caught by :func:`check_token_file`, which then names ``data.token_dtype``.

    ``setting``: ``data.token_dtype`` (auto, uint16, uint32); ``meta_dtype``: meta.pkl's dtype,
    normalised (:func:`meta_token_dtype`), or None; ``vocab_from``: ``"meta.pkl"`` or
    ``"data.vocab_size"``, where ``vocab_size`` came from; ``meta``: the meta.pkl path (beside
    ``train.bin``), for messages.
    Returns ``(name, why)``, e.g. ``("uint32", "data.token_dtype=auto, vocabulary 100,277 > 65,536")``.

    Raises:
        DataError: the two sources contradict, or the vocabulary does not fit the width.
    """
    if setting != "auto" and meta_dtype is not None and meta_dtype != setting:
        raise DataError(f"{meta}: dtype {meta_dtype} contradicts data.token_dtype={setting}; set data.token_dtype "
                        f"to {meta_dtype} or auto if the files hold {meta_dtype} ids, or correct meta.pkl")
    if setting != "auto":
        name, why = setting, f"data.token_dtype={setting}"
    elif meta_dtype is not None:
        name, why = meta_dtype, f"{meta.name}'s dtype"
    else:
        name = "uint16" if vocab_size <= 1 << 16 else "uint32"
        why = f"data.token_dtype=auto, vocabulary {vocab_size:,} {'<=' if name == 'uint16' else '>'} 65,536"
    limit = 1 << (8 * TOKEN_DTYPES[name].itemsize)
    if vocab_size > limit:
        target = meta if vocab_from == "meta.pkl" else meta.parent / TOKEN_FILES[0]
        if setting == "auto" and meta_dtype is not None:
            fix = "correct meta.pkl's dtype or vocab_size (ids written as uint16 beyond 65,535 have lost their high bits)"
        elif name == "uint16" and vocab_size <= 1 << 32:
            fix = "set data.token_dtype=uint32 (or auto)"
        else:
            fix = "autoln reads uint16 or uint32 ids"
        raise DataError(f"{target}: {name} ids ({why}) cannot hold a vocabulary of {vocab_size:,} ({vocab_from}; {name} holds "
                        f"{limit:,} ids): {fix}")
    return name, why


def meta_token_dtype(value, meta: Path) -> str:
    """meta.pkl's ``dtype`` (a string such as ``"uint32"``, a numpy dtype or type such as
    ``np.uint16``) as a :data:`TOKEN_DTYPES` name.

    Raises:
        DataError: not a dtype, or one autoln does not read (signed, 64-bit, big-endian), naming meta.pkl.
    """
    try:
        dt = np.dtype(value)
    except (TypeError, ValueError):
        dt = None
    if dt is None or dt.kind != "u" or dt.itemsize not in (2, 4) or dt.byteorder == ">":
        from autoln.core.errors import quoted

        raise DataError(f"{meta}: dtype {quoted(value)} is not a width autoln reads (uint16 or uint32, little-endian); "
                        "convert the token files to one (e.g. np.fromfile(f, dtype).astype(np.uint32).tofile(f)) and meta.pkl's dtype to match")
    return dt.name


def check_token_file(f: Path, size: int, name: str, why: str) -> None:
    """Check that the token file ``f`` (``size`` bytes) can hold ``name`` ids (:func:`token_width`,
    ``why`` its reason): a whole, non-zero number of them; no llm.c shard header
    (:data:`LLMC_MAGIC`); and, in its first :data:`WIDTH_SAMPLE` bytes, not the trace of wider
    ids, i.e. every second id 0 while others are not (little-endian ids narrower than 2^16 read
    two uint16 at a time give exactly that; no text gives id 0 at every other position).

    Raises:
        DataError: naming ``f``, the width, how it was chosen, and ``data.token_dtype``.
    """
    width = TOKEN_DTYPES[name].itemsize
    if size % width or size == 0:
        raise DataError(f"{f}: {size} bytes is not a whole, non-zero number of {name} tokens ({width} bytes each; {why})")
    with open(f, "rb") as fh:
        head = fh.read(WIDTH_SAMPLE - WIDTH_SAMPLE % 8)
    if len(head) >= 1024 and int(np.frombuffer(head[:4], dtype="<i4")[0]) == LLMC_MAGIC:
        raise DataError(f"{f}: starts with llm.c's shard header (magic {LLMC_MAGIC}), not headerless nanoGPT ids; drop its "
                        "first 1024 bytes (header version 1: uint16 ids, 2: uint32) and set data.token_dtype accordingly")
    words = np.frombuffer(head[: len(head) - len(head) % 8], dtype=TOKEN_DTYPES[name])
    if len(words) >= 64 and words[0::2].any() and not words[1::2].any():
        quads = words.reshape(-1, 8 // width)  # one 64-bit id per row
        if name == "uint16" and quads[:, 2:].any():
            wider, fix = "uint32", "set data.token_dtype=uint32"
        else:
            wider, fix = "64-bit", "autoln reads uint16 or uint32: convert them, e.g. np.fromfile(f, np.int64).astype(np.uint32).tofile(f)"
        raise DataError(f"{f}: read as {name} ({why}), every second id is 0: the file holds {wider} ids; {fix}")


def read_meta(meta: Path) -> tuple[int, Optional[list[str]], Optional[str]]:
    """nanoGPT's ``meta.pkl``: ``(vocab_size, itos as a list or None, dtype or None)``.

    The fields read: ``vocab_size`` (a positive integer); ``itos`` (id -> token string, as
    nanoGPT's char-level ``prepare.py`` writes it), which must name exactly the ids
    ``0 .. vocab_size - 1``; ``dtype`` (:func:`meta_token_dtype`), which some projects add.
    ``stoi`` (string -> id) and any other field are not used: autoln never encodes text.

    Raises:
        DataError: an unreadable file, or a field missing or not as described, naming the file and field.
    """
    import operator
    import pickle

    try:
        with open(meta, "rb") as fh:
            info = pickle.load(fh)  # the user's own file, as nanoGPT reads it
    except Exception as exc:  # noqa: BLE001 - any damage: one line naming the file
        raise DataError(f"{meta}: not a readable nanoGPT meta.pkl with a vocab_size ({type(exc).__name__}: {str(exc)[:120]})") from None
    if not isinstance(info, dict) or "vocab_size" not in info:
        raise DataError(f"{meta}: not a readable nanoGPT meta.pkl with a vocab_size (a dict with the key vocab_size; "
                        f"got {type(info).__name__}{' without it' if isinstance(info, dict) else ''})")
    try:
        vocab_size = operator.index(info["vocab_size"])
    except TypeError:
        vocab_size = 0
    if vocab_size <= 0 or isinstance(info["vocab_size"], bool):
        from autoln.core.errors import quoted

        raise DataError(f"{meta}: vocab_size must be a positive integer, got {quoted(info['vocab_size'])}")
    vocab = None
    if info.get("itos") is not None:
        itos = info["itos"]
        keys = range(len(itos)) if isinstance(itos, (list, tuple)) else itos.keys() if isinstance(itos, dict) else None
        if keys is None or len(itos) != vocab_size or set(keys) != set(range(vocab_size)):
            held = f"{len(itos):,} entries" if keys is not None else f"a {type(itos).__name__}"
            raise DataError(f"{meta}: itos must name each id 0 .. {vocab_size - 1:,} once (vocab_size {vocab_size:,}); it holds "
                            f"{held}: the vocabulary and its names disagree")
        vocab = [str(itos[i]) for i in range(vocab_size)]
    dtype = meta_token_dtype(info["dtype"], meta) if info.get("dtype") is not None else None
    return vocab_size, vocab, dtype


def read_token_files(cfg: DataConfig, folder: Path) -> Corpus:
    """A folder of nanoGPT token files: ``train.bin`` and ``val.bin``, headerless little-endian
    token ids of the width :func:`token_width` gives (uint16, as nanoGPT's ``prepare.py``
    writes them, or uint32), memory-mapped; ``val.bin``'s first half is the valid split, its
    second half the test split. The vocabulary size comes from ``data.vocab_size`` or the
    folder's ``meta.pkl`` (:func:`read_meta`: ``vocab_size``, ``itos`` when present, ``dtype``
    when present). Each file is checked to hold that width (:func:`check_token_file`) and ids
    inside the vocabulary. The fingerprint hashes each file's size and its first and last MiB
    (the files may be gigabytes), and the width when it is not uint16 (so uint16 folders keep
    the fingerprint they always had, and the same bytes read as uint32 are another corpus).

    Raises:
        DataError: a missing file, an unreadable or inconsistent ``meta.pkl``, no vocabulary
            size, a width that contradicts meta.pkl or does not fit the vocabulary or the file,
            a token id outside the vocabulary (each naming the file), or ``data.tokenizer``
            other than ``tokens``.
    """
    if cfg.tokenizer != "tokens":
        raise DataError(f"data.corpus={cfg.corpus} holds token files (train.bin): they are tokenised already, so "
                        f"data.tokenizer must be tokens, not {cfg.tokenizer}")
    for name in TOKEN_FILES:
        if not (folder / name).is_file():
            raise DataError(f"data.corpus={cfg.corpus}: missing {folder / name} (a token-file folder needs train.bin and val.bin, as nanoGPT's prepare.py writes)")
    vocab_size, vocab, meta_dtype, meta, vocab_from = cfg.vocab_size, None, None, folder / "meta.pkl", "data.vocab_size"
    if meta.is_file():
        meta_size, vocab, meta_dtype = read_meta(meta)
        if vocab_size is None:
            vocab_size, vocab_from = meta_size, "meta.pkl"
    if vocab_size is None:
        raise DataError(f"data.corpus={cfg.corpus}: the vocabulary size is unknown; set data.vocab_size (e.g. 50257 for "
                        "GPT-2's BPE) or put nanoGPT's meta.pkl beside the token files")
    dtype_name, why = token_width(cfg.token_dtype, meta_dtype, vocab_size, vocab_from, meta)
    arrays, h = {}, hashlib.sha256()
    for name in TOKEN_FILES:
        f = folder / name
        size = f.stat().st_size
        check_token_file(f, size, dtype_name, why)
        arrays[name] = np.memmap(f, dtype=TOKEN_DTYPES[dtype_name], mode="r")
        with open(f, "rb") as fh:
            h.update(str(size).encode())
            h.update(fh.read(1 << 20))
            fh.seek(max(0, size - (1 << 20)))
            h.update(fh.read(1 << 20))
    if dtype_name != "uint16":
        h.update(dtype_name.encode())
    for name, arr in arrays.items():
        top = int(arr.max())
        if top >= vocab_size:
            raise DataError(f"{folder / name}: token id {top} at position {int(arr.argmax())} is outside the vocabulary of "
                            f"{vocab_size} (data.vocab_size or meta.pkl; ids read as {dtype_name}: {why})")
    val = arrays["val.bin"]
    splits = {"train": arrays["train.bin"], "valid": val[: len(val) // 2], "test": val[len(val) // 2:]}
    sources = {"train": f"{folder / 'train.bin'} ({dtype_name})", "valid": f"{folder / 'val.bin'} (first half, {dtype_name})",
               "test": f"{folder / 'val.bin'} (second half, {dtype_name})"}
    return Corpus(cfg.corpus, "tokens", h.hexdigest(), vocab_size, vocab if vocab and len(vocab) == vocab_size else None,
                  splits, sources)


def bpe_tokenizer(cfg: DataConfig, train_text: str, folder: Path):
    """The ``tokenizers.Tokenizer`` of ``data.tokenizer: bpe``: the user's ``data.tokenizer_file``
    (a Hugging Face ``tokenizer.json``), or a byte-level BPE (GPT-2's pre-tokeniser, no special
    tokens) of ``data.bpe_vocab_size`` tokens trained on ``train_text`` and saved as
    ``folder/tokenizer.json`` (the cache entry's).

    Raises:
        DataError: ``tokenizers`` not installed (naming the pip command), or a
            ``tokenizer_file`` that does not load (naming it).
    """
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise DataError(f"data.tokenizer=bpe needs the optional Hugging Face tokenizers library; run "
                        f"{pip_extra('bpe')}") from None
    if cfg.tokenizer_file:
        try:
            return Tokenizer.from_file(str(Path(cfg.tokenizer_file).expanduser()))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception types
            raise DataError(f"data.tokenizer_file {cfg.tokenizer_file}: not a loadable Hugging Face tokenizer.json "
                            f"({type(exc).__name__}: {str(exc)[:160]})") from None
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=cfg.bpe_vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[], show_progress=False)
    lines = train_text.splitlines(keepends=True)
    tok.train_from_iterator((lines[i:i + 1000] for i in range(0, len(lines), 1000)), trainer=trainer, length=len(lines))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder / "tokenizer.json", tok.to_str())
    except OSError as exc:
        cache_note(exc, folder)  # caching is an optimisation
    return tok


def encode_bpe(tok, raw: dict[str, bytes], sources: dict[str, str]) -> tuple[dict[str, np.ndarray], list[str]]:
    """Token ids per split (``uint16`` up to 65,536 tokens, else ``int32``) and the vocabulary
    (id -> token string) of a ``tokenizers.Tokenizer``.

    Raises:
        DataError: a split that is not UTF-8 text (naming the file and the byte).
    """
    text = _decode(raw, sources)
    size = tok.get_vocab_size()
    dtype = np.uint16 if size <= 65536 else np.int32
    ids = {}
    for split, t in text.items():
        lines = t.splitlines(keepends=True)
        ids[split] = np.fromiter((i for enc in tok.encode_batch(lines) for i in enc.ids), dtype=np.int64).astype(dtype)
    vocab = [""] * size
    for token, i in tok.get_vocab().items():
        if i < size:
            vocab[i] = token
    return ids, vocab


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


def cache_note(exc: OSError, folder: Path) -> None:
    """Say in one ``note:`` line that the token cache ``folder`` could not be written (``exc``:
    the refused write, e.g. a full disk, naming its file): the run goes on from the tokens in
    memory, and a later run builds the cache again."""
    print(f"note: the token cache was not written ({exc.filename or folder}: {exc.strerror or exc}); this run goes on "
          "from the tokens in memory", file=sys.stderr)


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


def check_lengths(corpus: Corpus, context: int) -> None:
    """Every split must hold at least ``context + 1`` tokens, and train ``2 * (context + 1)``.

    Raises:
        DataError: naming the split's source and the sizes.
    """
    for split, arr in corpus.splits.items():
        need = (2 if split == "train" else 1) * (context + 1)
        if len(arr) < need:
            raise DataError(f"{corpus.sources[split]}: the {split} split has {len(arr)} tokens but needs at least "
                            f"{need} for model.context={context}")


def arch_split(n_tokens: int, context: int, chunk_tokens: int, arch_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut ``[0, n_tokens)`` into chunks and assign them to D_w and D_alpha by a seeded permutation.

    The chunk length is ``max(context + 1, min(chunk_tokens, n_tokens // 2))``; the last
    partial chunk is dropped. ``round(n_chunks * arch_fraction)`` chunks (at least 1, at
    most ``n_chunks - 1``) go to D_alpha.

    Returns:
        ``(w_chunks, alpha_chunks)``: int64 arrays ``(n, 2)`` of ``[start, end)`` token ranges.

    Raises:
        DataError: fewer than two chunks fit.
    """
    length = max(context + 1, min(chunk_tokens, n_tokens // 2))
    n_chunks = n_tokens // length
    if n_chunks < 2:
        raise DataError(f"the train split has {n_tokens} tokens: too few for two chunks of {length} (model.context + 1)")
    starts = np.arange(n_chunks, dtype=np.int64) * length
    chunks = np.stack([starts, starts + length], axis=1)
    perm = np.random.default_rng(seed).permutation(n_chunks)
    n_alpha = min(max(1, round(n_chunks * arch_fraction)), n_chunks - 1)
    return np.sort(chunks[perm[n_alpha:]], axis=0), np.sort(chunks[perm[:n_alpha]], axis=0)


class WindowSampler:
    """Persistent seeded sampler of random contiguous windows inside given token ranges.

    Args:
        tokens: 1-D token array.
        chunks: ``(n, 2)`` ``[start, end)`` ranges; a window of ``context + 1`` tokens never
            crosses a range's end. Ranges are drawn in proportion to their number of windows.
        context: ``T``; batch_size: ``B``; seed: seeds a ``numpy.random.Generator``.

    ``sample()`` returns ``(x, y)`` int64 tensors ``(B, T)`` with ``y`` shifted by one token.
    """

    def __init__(self, tokens: np.ndarray, chunks: np.ndarray, context: int, batch_size: int, seed: int) -> None:
        self.tokens, self.context, self.batch_size = tokens, context, batch_size
        self.starts = chunks[:, 0].astype(np.int64)
        counts = (chunks[:, 1] - chunks[:, 0] - context).astype(np.float64)
        if (counts <= 0).any():
            raise ValueError("every chunk must hold more than context tokens")
        self.p = counts / counts.sum()
        self.counts = counts.astype(np.int64)
        self.rng = np.random.default_rng(seed)

    def sample_starts(self) -> np.ndarray:
        """Start positions ``(B,)`` of the next batch's windows."""
        c = self.rng.choice(len(self.starts), size=self.batch_size, p=self.p)
        return self.starts[c] + (self.rng.random(self.batch_size) * self.counts[c]).astype(np.int64)

    def sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next batch ``(x, y)``, each ``(B, T)`` int64."""
        return windows(self.tokens, self.sample_starts(), self.context)

    def state_dict(self) -> dict:
        """The generator state, for checkpoints."""
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        self.rng.bit_generator.state = state["rng"]


def windows(tokens: np.ndarray, starts: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` int64 tensors ``(len(starts), context)``: ``x = tokens[s:s+T]``, ``y = tokens[s+1:s+T+1]``."""
    idx = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(context + 1)
    block = torch.from_numpy(np.asarray(tokens[idx], dtype=np.int64))
    return block[:, :-1], block[:, 1:]


def eval_starts(n_tokens: int, context: int, n_windows: Optional[int]) -> np.ndarray:
    """Starts of non-overlapping evaluation windows, evenly spaced over a split.

    ``n_windows=None`` (or more than fit) takes every non-overlapping window in order.
    """
    total = (n_tokens - 1) // context
    if n_windows is None or n_windows >= total:
        return np.arange(total, dtype=np.int64) * context
    return np.linspace(0, total - 1, n_windows).round().astype(np.int64) * context


def estimate_starts(final: np.ndarray, n_windows: Optional[int]) -> np.ndarray:
    """The windows of the evaluations before the last step: ``n_windows`` of the ``final``
    window starts (:func:`eval_starts` of ``final_eval_windows``), evenly spaced among them, so
    every estimate measures a subset of the very windows of the final number (all of them for
    ``None`` or ``n_windows >= len(final)``)."""
    if n_windows is None or n_windows >= len(final):
        return final
    return final[np.linspace(0, len(final) - 1, n_windows).round().astype(np.int64)]


def eval_batches(tokens: np.ndarray, starts: np.ndarray, context: int, batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches ``(x, y)`` ``(<=B, T)`` over the given window starts, in order."""
    for i in range(0, len(starts), batch_size):
        yield windows(tokens, starts[i:i + batch_size], context)


def estimate_text(metrics: Optional[dict], headline: str) -> str:
    """``2.367 ± 0.071 bits/byte``: a valid estimate with its standard error over windows (as
    the final number carries it), ``-`` before the first evaluation."""
    if not metrics:
        return "-"
    se = metrics.get(f"{headline}_stderr")
    return f"{metrics[headline]:.3f}" + (f" ± {se:.3f}" if se is not None else "") + f" {UNITS[headline]}"


def metrics_from_loss(loss_nats: float, tokenizer: str, bytes_per_token: Optional[float] = None) -> dict[str, float]:
    """Report a mean cross-entropy (nats per token) in the units of docs/design.md §8.

    Returns ``loss`` (nats/token), ``perplexity`` (``exp(loss)``, per token), and
    ``bits_per_byte`` (bytes: ``loss / ln 2``; BPE: ``loss / ln 2 / bytes_per_token``, the
    split's bytes over its tokens, so that BPE and bytes compare) or ``bits_per_char`` (chars,
    ``loss / ln 2``).

    Raises:
        ValueError: ``bpe`` without a positive ``bytes_per_token``.
    """
    out = {"loss": loss_nats, "perplexity": math.exp(min(loss_nats, 700.0))}
    if tokenizer in ("bytes", "chars"):
        out[HEADLINE[tokenizer]] = loss_nats / math.log(2)
    elif tokenizer == "bpe":
        if not bytes_per_token or bytes_per_token <= 0:
            raise ValueError("metrics_from_loss: bpe needs the split's bytes per token")
        out["bits_per_byte"] = loss_nats / math.log(2) / bytes_per_token
    return out
