"""Search where the layer norms go: ``python search.py [--config FILE] [--set KEY=VALUE ...] [--out DIR]``."""

import sys

from autoln.cli import search_main

if __name__ == "__main__":
    sys.exit(search_main())
