"""Trainer backend over Hugging Face transformers and torch.

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.config import setting
from astraflow.rl.options import PolicyGradientOptions, check_policy_gradient, parallel_sizes

MIXED_PRECISION = ("none", "bfloat16")


@dataclass
class HFConfig(PolicyGradientOptions):
    """Settings of ``trainer=hf``: the shared optimisation settings, and the device.

    ``device``: ``auto`` trains on the first CUDA device when there is one, else on the
    CPU; or ``cpu``, ``cuda``, ``cuda:N``. With ``world_size`` > 1 each rank takes its
    own device (``LOCAL_RANK``) and the model is sharded with FSDP2 (one unit per
    decoder layer, and the rest).

    ``mixed_precision``: ``bfloat16`` computes in bfloat16 while the master weights,
    optimiser and gradient reductions stay in ``dtype``; ``none`` computes in ``dtype``.
    ``activation_checkpointing`` recomputes each decoder layer's activations in the
    backward pass instead of keeping them. ``cpu_offload`` keeps the sharded parameters,
    gradients and optimiser state in CPU memory and steps the optimiser there (FSDP2,
    GPUs). ``reshard_after_forward`` frees gathered parameters after each layer's
    forward (less memory, one more gather in the backward pass).

    ``shared_prefix``: the tokens a group's samples start with (its prompt) go through
    the model once per micro-batch instead of once per sample; the samples' own tokens
    attend to that one computation's keys and values, and the loss and gradients are
    the plain pass's (see :mod:`astraflow.rl.shared_prefix`). The first shared
    micro-batch is checked against the plain pass, and a model whose cache does not
    reproduce it trains without sharing. Off under ``activation_checkpointing``
    (transformers drops the cache there) and with ``world_size`` > 1.

    ``router_replay`` (mixture-of-experts models): the rollout engine records the
    experts every MoE layer routed each token to, and the trainer's forward sends each
    token to the same ones, weighted by its own router's probabilities (so the router
    still trains); see :mod:`astraflow.models.router_replay`. It needs an engine that
    records them (``raas=hf``) and one process (``world_size`` 1); the prompt is then
    not shared (``shared_prefix`` is off). A step on trajectories that carry routing
    logs ``routing_mismatch``, the fraction of (token, layer) pairs whose experts the
    trainer's own router would have chosen otherwise, and ``routing_difference``, the
    fraction its forward did route otherwise (0 with replay).
    """

    name: str = "hf"
    device: str = "auto"
    mixed_precision: str = setting("none", choices=MIXED_PRECISION)
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    reshard_after_forward: bool = True
    shared_prefix: bool = True
    router_replay: bool = False


#: what a ``config.json`` of a mixture-of-experts model counts its experts by
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


def check_config(config, model_path: str | None = None) -> None:
    """``trainer=hf``'s settings judged without importing torch (the launcher's
    pre-flight and the backend both call it); with ``model_path``, against the
    checkpoint too."""
    check_policy_gradient(config)
    if config.router_replay and model_path:
        import json
        from pathlib import Path

        file = Path(model_path) / "config.json"
        model = json.loads(file.read_text()) if file.is_file() else {}
        text = model.get("text_config") or model
        if not any(text.get(key) for key in EXPERT_KEYS):
            raise ValueError(f"trainer.router_replay=true: {model_path} is not a "
                             "mixture-of-experts model (its config.json counts no experts); "
                             "there is no routing to replay")
    dp, tp, pp = parallel_sizes(config)
    if tp != 1 or pp != 1:
        raise ValueError(
            f"trainer.tensor_model_parallel_size={tp}, pipeline_model_parallel_size={pp}: "
            "trainer=hf shards by data parallelism (FSDP2) only; use trainer=megatron "
            "for tensor parallelism")
    if config.router_replay and dp != 1:
        raise ValueError(f"trainer.router_replay=true: replays routing in one process; "
                         f"trainer.world_size={dp} is not supported with it yet")
    if config.cpu_offload and dp == 1:
        raise ValueError("trainer.cpu_offload=true offloads FSDP2 shards: it needs "
                         "trainer.world_size > 1")
    if config.cpu_offload and config.device == "cpu":
        raise ValueError("trainer.cpu_offload=true moves FSDP2 shards off GPUs: it needs "
                         "a CUDA device, not trainer.device=cpu")


@hookimpl
def astraflow_register_trainer_backends(register):
    register(
        "hf",
        "astraflow_trainer_hf.backend:HFTrainerBackend",
        HFConfig,
        description="Trainer backend over Hugging Face transformers and torch.",
        check=check_config,
    )
