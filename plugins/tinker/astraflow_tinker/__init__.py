"""A Tinker-compatible training service (``astraflow tinker``).

The official ``tinker`` SDK, unchanged, drives it: LoRA training clients (each a tenant
with its own adapter and AdamW state on one base model, none waiting for another),
sampling clients over any tenant's saved weights, durable saved states. See
``docs/tinker.md``.
"""
