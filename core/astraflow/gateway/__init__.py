"""The OpenAI-compatible endpoint of a RaaS node and its token-exact recording."""
