"""Models made locally: the tiny Llama-style model and its character tokenizer.

Any checkpoint's tokenizer, this one's included, loads with
:func:`astraflow.text.load_tokenizer`.
"""

from astraflow.models.tiny import build_tokenizer, make_tiny_model

__all__ = ["build_tokenizer", "make_tiny_model"]
