"""What a corpus is (:class:`Corpus`, a tokenised corpus, and :func:`check_lengths`) and where
its text comes from (docs/design.md §8): the raw bytes of the three splits (:func:`read_splits`).

- Corpus: ``stdlib`` (the Python standard library's ``*.py`` sources, sorted by relative path,
  read as bytes; needs no download), a single text file (the last ``test_fraction`` is test,
  the ``valid_fraction`` before it valid, both cut at line ends), a folder in the WikiText
  layout (``train.txt``, ``valid.txt``, ``test.txt``), or a WikiText short name of
  :data:`HF_CORPORA` (``wikitext-2`` ...), fetched by Hugging Face ``datasets`` (the optional
  extra ``autoln[hf]``) into its own cache, and read from that cache when offline. An existing
  path always wins over a short name.
"""

from __future__ import annotations

import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np

from autoln.config import DataConfig
from autoln.core.commands import pip_extra
from autoln.core.errors import DataError

SPLITS = ("train", "valid", "test")
EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}
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
