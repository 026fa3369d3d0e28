"""What one policy's trainer needs to know about a run: its typed section.

The runtime never reads the whole run config: :func:`settings_from_config` reduces it to
a :class:`TrainerSettings`. The settings a run config also has take their defaults and
ranges from its schema (:mod:`astraflow.schema`), so none is written twice.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from astraflow.components import trainer_settings
from astraflow.errors import ConfigError
from astraflow.rl.options import PolicyGradientOptions
from astraflow.schema import AstraFlowConfig, check_instance, like

_RUN = {f.name: f for f in dataclasses.fields(AstraFlowConfig)}
_TRAINER = {f.name: f for f in dataclasses.fields(PolicyGradientOptions)}


@dataclass(frozen=True)
class TrainerSettings:
    """Run settings of one policy's trainer.

    ``backend`` is the name a ``trainer_backend`` plugin registers (``trainer.name``),
    ``backend_config`` the trainer section with this policy's overrides (what the
    backend is built with), ``model_path`` the weights it starts from.
    """

    policy: str
    backend: str
    backend_config: Any
    model_path: str
    steps: int = like(_RUN["steps"])
    batch_size: int = like(_RUN["batch_size"])
    checkpoint_interval: float = like(_RUN["checkpoint_interval"])
    fetch_ahead: bool = like(_RUN["fetch_ahead"])
    overlap_publish: bool = like(_RUN["overlap_publish"])
    record_batches: bool = like(_RUN["record_batches"])
    #: ranks of this trainer (``torchrun`` starts them; 1: this process alone)
    world_size: int = like(_TRAINER["world_size"])
    #: seconds a collective between ranks may take before the trainer gives up
    collective_timeout: float = like(_TRAINER["collective_timeout"])

    def __post_init__(self) -> None:
        wrong = check_instance(self, "trainer.")
        if wrong:
            raise ConfigError("; ".join(wrong))

    @property
    def trainer_id(self) -> str:
        """How the data layer knows this trainer."""
        return f"trainer-{self.policy}"


def settings_from_config(cfg: Any, policy: str) -> TrainerSettings:
    """Reduce a composed run config to ``policy``'s trainer settings."""
    backend = trainer_settings(cfg, policy)
    if cfg.model.path is None:
        raise ConfigError("the trainer needs model.path (the launcher sets it)")
    return TrainerSettings(
        policy=policy, backend=str(cfg.trainer.name), backend_config=backend,
        model_path=str(cfg.model.path), steps=int(cfg.steps),
        batch_size=int(cfg.batch_size),
        checkpoint_interval=float(cfg.checkpoint_interval),
        fetch_ahead=bool(cfg.get("fetch_ahead", True)),
        overlap_publish=bool(cfg.get("overlap_publish", True)),
        record_batches=bool(cfg.get("record_batches", False)),
        **{name: backend[name] for name in ("world_size", "collective_timeout")
           if backend.get(name) is not None})
