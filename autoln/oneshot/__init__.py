"""The one-shot search: the supernet trained bilevel, and the genotype read off it (DARTS;
docs/design.md §4-7).

- :mod:`~autoln.oneshot.architect`: the bilevel step on the alphas (first or second order).
- :mod:`~autoln.oneshot.search_loop`: the one search loop, for ``search.py`` and ``autoln.search``;
  :mod:`~autoln.oneshot.search_pieces` its callbacks (evaluation, checkpoints, logging).
- :mod:`~autoln.oneshot.monitor`: the collapse monitor (Hessian eigenvalue, entropies).
- :mod:`~autoln.oneshot.selection`: a trained supernet to a genotype (argmax, perturbation, score).
- :mod:`~autoln.oneshot.fidelity`: genotypes sampled from the space, scored by the supernet,
  Kendall's tau against retrains.
- :mod:`~autoln.oneshot.run_search`: the search job of ``search.py``;
  :mod:`~autoln.oneshot.consensus`: ``search.py --seeds N`` and their consensus.

Hands :mod:`autoln.retrain`, :mod:`autoln.tune` and :mod:`autoln.race` a genotype file.
"""
