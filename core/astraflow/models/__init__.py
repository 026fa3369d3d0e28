"""Models made locally: the tiny Llama-style model and its character tokenizer."""

from astraflow.models.tiny import (
    TextTokenizer,
    build_tokenizer,
    load_tokenizer,
    make_tiny_model,
)

__all__ = ["TextTokenizer", "build_tokenizer", "load_tokenizer", "make_tiny_model"]
