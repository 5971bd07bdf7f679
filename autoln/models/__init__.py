"""The models that carry the search space, and the genotype that describes a derived model.

- :mod:`~autoln.models.model`: the Transformer language model with a norm site per sublayer,
  shared by the supernet and the derived model; :func:`~autoln.models.model.build_derived`.
- :mod:`~autoln.models.supernet`: every site mixes all candidates through ``softmax(alpha / tau)``.
- :mod:`~autoln.models.genotype`: the per-site placements as one JSON file, the named placements
  (``all-pre``, ``mix-ln``, ...).
- :mod:`~autoln.models.diagnostics`: the papers' stability diagnostics on one batch.
- :mod:`~autoln.models.resources`: a model's memory estimate, checked before a run builds it.

Built on :mod:`autoln.space`, :mod:`autoln.config` and :mod:`autoln.core`; trained by
:mod:`autoln.engine`, searched by :mod:`autoln.oneshot`, retrained by :mod:`autoln.retrain`.
"""
