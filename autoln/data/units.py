"""The units results are reported in (docs/design.md §8): the headline metric of each tokeniser
(:data:`HEADLINE`, :data:`UNITS`), a mean cross-entropy in those units (:func:`metrics_from_loss`)
and an estimate as text (:func:`estimate_text`).
"""

from __future__ import annotations

import math
from typing import Optional

#: The headline metric per tokeniser: bits per byte for bytes, bits per character for
#: characters, perplexity for words (docs/design.md §8).
HEADLINE = {"bytes": "bits_per_byte", "chars": "bits_per_char", "words": "perplexity", "bpe": "bits_per_byte",
            "tokens": "perplexity"}
#: The headline metric's unit as progress bars and messages show it.
UNITS = {"bits_per_byte": "bits/byte", "bits_per_char": "bits/char", "perplexity": "perplexity"}


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
