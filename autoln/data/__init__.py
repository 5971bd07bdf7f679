"""The data of a run: corpora, tokenisers, the splits and windows the model sees, and the units
results are reported in (docs/design.md §4, §8).

- :mod:`autoln.data.corpus`: :class:`Corpus`, the text sources (:func:`stdlib_files`), :func:`check_lengths`.
- :mod:`autoln.data.tokens`: :func:`tokenize`, BPE, nanoGPT token files and their width (:func:`token_width`).
- :mod:`autoln.data.load`: :func:`load_corpus`, read and tokenised once, then opened from the cache.
- :mod:`autoln.data.sampling`: :func:`arch_split`, :class:`WindowSampler`, :func:`windows`, the
  evaluation windows (:func:`eval_starts`, :func:`estimate_starts`, :func:`eval_batches`).
- :mod:`autoln.data.units`: :data:`HEADLINE`, :data:`UNITS`, :func:`metrics_from_loss`, :func:`estimate_text`.
"""

from autoln.data.corpus import Corpus, check_lengths, stdlib_files
from autoln.data.load import load_corpus
from autoln.data.tokens import token_width, tokenize
from autoln.data.units import HEADLINE, UNITS, estimate_text, metrics_from_loss
from autoln.data.sampling import WindowSampler, arch_split, estimate_starts, eval_batches, eval_starts, windows

__all__ = [
    "Corpus",
    "HEADLINE",
    "UNITS",
    "WindowSampler",
    "arch_split",
    "check_lengths",
    "estimate_starts",
    "estimate_text",
    "eval_batches",
    "eval_starts",
    "load_corpus",
    "metrics_from_loss",
    "stdlib_files",
    "token_width",
    "tokenize",
    "windows",
]
