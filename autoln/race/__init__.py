"""The race that decides: the supernet's shortlist against the named placements, decided by
real retrains (docs/design.md §10, docs/race.md).

- :mod:`~autoln.race.sequential`: the final's group-sequential paired t-test (alpha-spending
  boundaries, futility, its simulation).
- :mod:`~autoln.race.rule`: the rule alone, as pure functions of the measured values: the pool,
  the rungs' steps, the final over seeds. No training: the Python API's ``race_genotypes`` runs
  it too.
- :mod:`~autoln.race.propose`: the proposers of proposal rounds (``race.proposer``: random,
  prior, local, ridge, tpe, gp).
- :mod:`~autoln.race.schedule`: what runs next: successive halving of the searched entries in
  rounds (the shortlist, then proposals within ``race.budget``), the named placements at the
  full budget, the final seed by seed, the horizons.
- :mod:`~autoln.race.verdict`: the answer of a finished race and its line (with the lead at
  longer budgets, ``race.horizons``).
- :mod:`~autoln.race.run_race`: ``search.py``'s race: the rule's retrains as jobs of the tune
  study's storage (resumable, several workers), ``race.json``; :mod:`~autoln.race.figure`:
  ``race.png`` and the race's TensorBoard entries.

Hands the faces (:mod:`autoln.cli`, :mod:`autoln.api`) the answer and its verdict line.
"""
