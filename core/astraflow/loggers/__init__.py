"""Metric loggers (``logger=[tensorboard,wandb,mlflow]``) and the launcher's feed of them."""
