"""The retrain that measures: a genotype's derived model trained from scratch (docs/design.md §1).

- :mod:`~autoln.retrain.run_retrain`: the retrain job of ``retrain.py`` (resumable, diagnostics,
  ``metrics.json`` in bits per byte or the corpus's unit).
- :mod:`~autoln.retrain.compare`: ``retrain.py --compare``: genotypes and named placements at
  one budget, data order and seeds, tabulated and plotted.
- :mod:`~autoln.retrain.ranking`: means over seeds and the tie rule.

Hands :mod:`autoln.tune` and :mod:`autoln.race` retrains to judge candidates by.
"""
