"""Does the supernet rank the space? Supernet variants scored against the ground-truth tables
(Kendall's tau, top-10 % hits, the read-off's percentile), the ways of reading a genotype off
one trained supernet, and how strongly each model start amplifies its first update.
"""
