"""TODO oneshot."""
