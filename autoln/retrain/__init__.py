"""TODO retrain."""
