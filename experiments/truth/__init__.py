"""What is the ground truth of the space, and does a ranking last at longer training? Random
genotypes of the searched space retrained and kept as tables (autoln's settings and nanoGPT's own
model), the tables' best and the named placements at 4x the steps, the answer at multiples of the
retrain budget, and an independent minimal model that checks a placement's poor number.
"""
