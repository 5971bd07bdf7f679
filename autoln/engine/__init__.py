"""What every run shares, the search and the retrain alike: one training step, its checkpoints,
its folder, and several runs at once.

- :mod:`~autoln.engine.training`: device, seeding, AdamW with warm-up and cosine, evaluation,
  progress, run folders and provenance.
- :mod:`~autoln.engine.checkpoint`: checkpoints and exact resume, stop signals.
- :mod:`~autoln.engine.folders`: a finished retrain's folder (``metrics.json``, its config's
  differences from another).
- :mod:`~autoln.engine.workers`: ``--workers N``: runs in processes, the CPU threads shared.

Built on :mod:`autoln.models`, :mod:`autoln.data`, :mod:`autoln.config` and :mod:`autoln.core`.
"""
