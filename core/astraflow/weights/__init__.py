"""weights."""
