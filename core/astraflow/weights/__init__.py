"""Versioned per-policy weight streams: full snapshots, sparse bf16 deltas, HTTP pull.

Torch-free on purpose: trainers, the data layer and RaaS nodes all speak raw bits in
numpy arrays and standard safetensors files, so none of them needs an ML framework to
move weights around.
"""
