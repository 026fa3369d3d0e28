"""Built-in task sources and reward functions."""
