"""A simulated rollout backend: latency without a model, for scale and fault tests.

Its tokens are sampled from the model's tokenizer vocabulary, not from the model, so
rewards carry no signal: use it to load the data layer with hundreds of nodes or to
kill components mid-run, never to claim anything about learning.
"""

from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.config import setting


@dataclass
class SimConfig:
    """Settings of ``raas=sim``: how long a request takes; nothing about quality."""

    name: str = "sim"
    #: seconds per generate call before the first token (prefill, queueing)
    generation_seconds: float = setting(0.05, ge=0)
    #: seconds per generated token of the longest sample in a call (decode)
    token_seconds: float = setting(0.0, ge=0)
    #: seconds the environment takes per call (a tool or simulator answering the turn)
    env_seconds: float = setting(0.0, ge=0)
    #: seed of sampled (temperature > 0) generations
    seed: int = setting(0, ge=0)


@hookimpl
def astraflow_register_rollout_backends(register):
    register(
        "sim",
        "astraflow_raas_sim.backend:SimRolloutBackend",
        SimConfig,
        description="Simulated engine (latency, vocabulary-sampled tokens) for scale and "
        "fault tests; never for learning claims.",
    )
