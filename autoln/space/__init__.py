"""TODO space."""
