"""Retrain a genotype from scratch: ``python retrain.py --genotype FILE_OR_NAME [--config FILE] [--set ...] [--out DIR]``."""

import sys

from autoln.cli import retrain_main

if __name__ == "__main__":
    sys.exit(retrain_main())
