"""Does the search, ended by its race, decide well? The race in autoln's model and in nanoGPT's
(the answer against the best named placement at fresh seeds), the API's answer against
nanoGPT's own Pre-LN, and random search at the search's budget, run for real and replayed
through the same race from the retrain table.
"""
