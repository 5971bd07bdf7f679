"""Is the search stable across its seeds? Several search seeds per bilevel variant, the seeds'
answers against their consensus retrained, and whether a single search (one method at several
search seeds, each answer retrained) is dependable.
"""
