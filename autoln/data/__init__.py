"""TODO face of data."""

from autoln.data._data import (  # noqa: F401
    Corpus,
    HEADLINE,
    UNITS,
    WindowSampler,
    arch_split,
    check_lengths,
    estimate_starts,
    estimate_text,
    eval_batches,
    eval_starts,
    load_corpus,
    metrics_from_loss,
    stdlib_files,
    token_width,
    tokenize,
    windows,
)
