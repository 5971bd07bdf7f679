"""What every experiment builds on: the table of every measured retrain (``retrain_table``),
successive halving (``halving``), the race's own verdict on a replayed final at a longer budget
(``lasts``), and the three settings with the searched genotype against
every named baseline (``validate``: is the searched genotype the right answer?).
"""
