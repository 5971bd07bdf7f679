"""The search space: where a sublayer's norm can go, as formulas (docs/design.md §2-4).

- :mod:`~autoln.space.placements`: the candidate registry (Pre-LN, Post-LN, DeepNorm, Peri-LN,
  ...): each placement's forward formula, its residual scale and init (DeepNorm's alpha, beta).
- :mod:`~autoln.space.mixing`: how a site's alphas become its candidates' weights (softmax,
  Gumbel, sigmoid) and their entropy.
- :mod:`~autoln.space.branches`: the branch weights DeepNorm's init gain scales in a user's block.

Plain functions of tensors, importing nothing of autoln: the models (:mod:`autoln.models`) and
the configuration (:mod:`autoln.config`) are built on it.
"""
