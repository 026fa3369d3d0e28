"""A rollout node and an evaluator read their own section of the run config: the
option sections handed on as they are, the run's settings typed, with its defaults."""

from __future__ import annotations

import pytest

from astraflow.config import compose_config
from astraflow.errors import ConfigError
from astraflow.evaluate import eval_settings
from astraflow.raas.settings import NodeSettings, settings_from_config
from astraflow.schema import AstraFlowConfig


def test_a_node_s_settings_are_the_run_s(tmp_path):
    cfg = compose_config([f"model.path={tmp_path}", "trainer.lora.rank=8",
                          "partial_rollouts=true", "workflow.temperature=0.5"])
    node = settings_from_config(cfg)
    assert node.model_path == str(tmp_path) and node.policies == ["policy"]
    assert (node.lora_rank, node.partial_rollouts, node.router_replay) == (8, True, False)
    assert node.raas.name == cfg.raas.name and node.workflow.temperature == 0.5
    assert node.reward.name == cfg.reward.name and node.task.name == cfg.task.name


def test_a_node_without_a_model_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"model\.path"):
        settings_from_config(compose_config([]))


def test_unset_settings_have_the_run_config_s_defaults(tmp_path):
    node = NodeSettings(model_path="m", policies=["p"], raas={}, workflow={}, reward={},
                        task={})
    run = AstraFlowConfig()
    assert node.partial_rollouts == run.partial_rollouts
    settings = eval_settings(compose_config([f"model.path={tmp_path}", "eval_every=7"]))
    assert (settings.eval_every, settings.eval_samples, settings.eval_deferred) == (
        7, run.eval_samples, run.eval_deferred)
