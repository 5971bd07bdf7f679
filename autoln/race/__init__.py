"""TODO race."""
