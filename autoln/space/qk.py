"""QK-norm: a norm on the queries and keys before their dot product, the choice beside the placement (docs/design.md §2).

A norm on ``q`` and ``k`` bounds the attention logits ``q . k / sqrt(d_head)``, whose growth
makes high learning rates diverge (Dehghani et al. 2023, "Scaling Vision Transformers to 22
Billion Parameters", §3.1.2; Wortsman et al. 2023, "Small-scale proxies for large-scale
Transformer training instabilities", §3.1). Open models pair it with a placement: OLMo 2 with the
output norm (Team OLMo 2024, arXiv 2501.00656, §3.2.1), Gemma 3 with the sandwich norm (Peri-LN),
Qwen 3 with Pre-LN.

Candidates, by name (:data:`QK_NORMS`; its value is the width each norm spans):

- ``none``: ``q`` and ``k`` as the projections give them;
- ``qk``: one norm per head, over the head's ``d_head = d_model / n_heads`` channels, the gain
  shared by the heads (ViT-22B, Gemma 3, Qwen 3: ``q_norm = RMSNorm(head_dim)``);
- ``qk-all``: one norm across the heads, over all ``d_model`` channels (OLMo 2:
  ``q_norm = RMSNorm(d_model)`` before the split into heads). The gpt-neox PRs #1100 and #1367
  debate the two.

``q`` and ``k`` get norms of their own (two gains), of the model's norm type
(:data:`autoln.space.placements.NORMS`). Shapes: ``(..., d_model)``, heads not yet split.
"""

from __future__ import annotations

from typing import Optional

#: QK-norm candidates: name -> what the norm spans (None: no norm).
QK_NORMS: dict[str, Optional[str]] = {"none": None, "qk": "head", "qk-all": "model"}

#: Named placements that pair a placement with QK-norm: name -> (placement, QK candidates in
#: order of preference). OLMo 2's norm spans the heads (``qk-all``); where only ``qk`` is
#: searched, ``olmo2`` takes it.
QK_NAMED: dict[str, tuple[str, tuple[str, ...]]] = {
    "olmo2": ("outnorm", ("qk-all", "qk")),
    "gemma3": ("peri", ("qk",)),
    "qwen3": ("pre", ("qk",)),
}


def check_qk_candidates(candidates, field: str = "model.qk_norm") -> list[str]:
    """``candidates`` as a list of QK-norm names, checked.

    Raises:
        ValueError: not a non-empty list of names of :data:`QK_NORMS`, or a name twice; the
            message names ``field``."""
    if isinstance(candidates, str) or not hasattr(candidates, "__iter__"):
        raise ValueError(f"{field}: expected a list of QK-norm names from {list(QK_NORMS)}, got {candidates!r}")
    out = list(candidates)
    if not out:
        raise ValueError(f"{field}: expected at least one of {list(QK_NORMS)} (['none'] for no QK-norm)")
    for name in out:
        if name not in QK_NORMS:
            raise ValueError(f"{field}: {name!r} is not a QK-norm candidate; expected names of {list(QK_NORMS)}")
    if len(set(out)) != len(out):
        raise ValueError(f"{field}: a candidate given twice in {out}")
    return out


def named_qk(name: str, placements, qk_candidates) -> Optional[tuple[str, str]]:
    """The ``(placement, QK choice)`` of the named placement ``name`` of :data:`QK_NAMED`, or
    None where its parts are not candidates (its placement not in ``placements``, none of its
    QK choices in ``qk_candidates``).

    Raises:
        KeyError: ``name`` is not in :data:`QK_NAMED`."""
    placement, choices = QK_NAMED[name]
    if placement not in placements:
        return None
    for choice in choices:
        if choice in qk_candidates:
            return placement, choice
    return None


def plain_qk(qk_candidates) -> str:
    """The QK choice of a named placement without QK-norm of its own (``all-pre``, ``mix-ln``,
    ...): ``none`` where it is a candidate, else the first candidate (a model whose QK-norm is
    fixed keeps it in every genotype)."""
    cands = list(qk_candidates)
    return "none" if "none" in cands else cands[0]
