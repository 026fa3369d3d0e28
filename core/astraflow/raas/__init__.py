"""raas."""
