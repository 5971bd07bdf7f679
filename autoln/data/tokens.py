"""Tokenisers and token files (docs/design.md §8): text to token ids, or ids read as they are.

- Tokenisers: ``bytes`` (vocabulary 256), ``chars`` (the training split's characters, plus
  ``<unk>`` if valid/test hold others), ``words`` (WikiText-style: whitespace split, ``<eos>``
  after every line, vocabulary from the training split in first-seen order, unseen words ->
  ``<unk>``) (:func:`tokenize`), and ``bpe`` (:func:`bpe_tokenizer`, :func:`encode_bpe`).
- Token files: a folder of nanoGPT's ``train.bin`` and ``val.bin`` (:func:`read_token_files`),
  their width (:func:`token_width`) and ``meta.pkl`` (:func:`read_meta`).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Optional

import numpy as np

from autoln.config import DataConfig
from autoln.core.commands import pip_extra
from autoln.core.errors import DataError
from autoln.core.io import write_text_atomic
from autoln.data.corpus import Corpus

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


def cache_note(exc: OSError, folder: Path) -> None:
    """Say in one ``note:`` line that the token cache ``folder`` could not be written (``exc``:
    the refused write, e.g. a full disk, naming its file): the run goes on from the tokens in
    memory, and a later run builds the cache again."""
    print(f"note: the token cache was not written ({exc.filename or folder}: {exc.strerror or exc}); this run goes on "
          "from the tokens in memory", file=sys.stderr)
