"""What a RaaS node (and an evaluator, a node of its own) needs to know about a run:
its typed section.

The node never reads the whole run config: :func:`settings_from_config` reduces it to a
:class:`NodeSettings`. The option sections (``raas``, ``workflow``, ``reward``, ``task``)
are the plugins' own configs, handed on as they are; the settings a run config also has
take their defaults and ranges from its schema.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from astraflow.errors import ConfigError
from astraflow.rl.options import lora_rank
from astraflow.schema import AstraFlowConfig, like

_RUN = {f.name: f for f in dataclasses.fields(AstraFlowConfig)}


@dataclass(frozen=True)
class NodeSettings:
    """Run settings of one RaaS node.

    ``policies``: the run's policy names; ``raas``, ``workflow``, ``reward`` and
    ``task``: the engine's, the workflow's, the reward's and the task source's option
    configs (each with its ``name``); ``lora_rank`` > 0 serves every policy as an adapter
    of ``model_path`` on one engine; ``router_replay``: generations carry the engine's
    expert routing for the trainer to replay.
    """

    model_path: str
    policies: list[str]
    raas: Any
    workflow: Any
    reward: Any
    task: Any
    lora_rank: int = 0
    router_replay: bool = False
    partial_rollouts: bool = like(_RUN["partial_rollouts"])


def settings_from_config(cfg: Any) -> NodeSettings:
    """Reduce a composed run config to a node's settings."""
    if cfg.model.path is None:
        raise ConfigError("a rollout node needs model.path (the launcher sets it)")
    return NodeSettings(
        model_path=str(cfg.model.path), policies=list(cfg.policies), raas=cfg.raas,
        workflow=cfg.workflow, reward=cfg.reward, task=cfg.task,
        lora_rank=lora_rank(cfg.trainer),
        router_replay=bool(cfg.trainer.get("router_replay", False)),
        partial_rollouts=bool(cfg.get("partial_rollouts", False)))
