"""Config composition: every option of every group, both override spellings, strictness."""

from __future__ import annotations

import pytest

from astraflow.config import GROUPS, compose_config, group_options
from astraflow.errors import ConfigError, UnknownOptionError

CASES = [(group, option) for group in GROUPS for option in group_options(group)]


def test_every_group_has_options():
    for group in GROUPS:
        assert group_options(group), f"config group {group!r} has no options"


@pytest.mark.parametrize(("group", "option"), CASES, ids=[f"{g}={o}" for g, o in CASES])
def test_every_option_composes(group, option):
    cfg = compose_config([f"{group}={option}"])
    if group == "data":
        assert option in cfg.data
    elif group == "experiment":
        assert cfg.raas.name and cfg.trainer.name
    else:
        assert cfg[group] is not None
        if "name" in cfg[group]:
            assert cfg[group].name == option


def test_plus_and_plain_spellings_agree():
    plus = compose_config(["+raas=vllm", "+trainer=hf"])
    plain = compose_config(["raas=vllm", "trainer=hf"])
    assert plus == plain
    assert plus.raas.name == "vllm"


def test_no_override_gives_the_cpu_default():
    cfg = compose_config([])
    assert (cfg.raas.name, cfg.trainer.name, cfg.task.name) == ("hf", "hf", "arithmetic")


def test_several_data_algorithms_compose():
    cfg = compose_config(["+data=[dynamic_sampling,greso,replay]"])
    assert set(cfg.data) == {"dynamic_sampling", "greso", "replay"}


def test_option_fields_can_be_overridden():
    cfg = compose_config(["task.max_operand=9", "workflow.max_new_tokens=3"])
    assert cfg.task.max_operand == 9 and cfg.workflow.max_new_tokens == 3


@pytest.mark.parametrize(("override", "said"), [
    ("+raas.nonsense=1", "raas.nonsense is not a setting; raas has: device, dtype, "
     "max_batch_size, max_batch_tokens, name, num_threads, prefix_cache_gib, "
     "prefix_cache_min_tokens, shared_prefix"),
    ("+nonsense=1", "nonsense is not a setting"),
    ("+model.hiden_size=3", "model.hiden_size is not a setting; model has: hidden_size, "
     "intermediate_size, max_position_embeddings, num_heads, num_layers, path, "
     "warmstart_steps (did you mean hidden_size?)"),
    ("+launcher.max_restartz=5", "launcher.max_restartz is not a setting; launcher has: "
     "autoscale_cooldown, autoscale_interval, kind, max_restarts, memory_check, "
     "node_throttle, preload, "
     "preload_modules, progress, restart_window (did you mean max_restarts?)"),
])
def test_an_unknown_key_appended_with_plus_names_the_nearest_setting(override, said):
    """``+key=value`` adds a key Hydra cannot refuse: the schema does, in the words a
    mistyped key without ``+`` gets."""
    with pytest.raises(ConfigError) as refused:
        compose_config([override])
    assert str(refused.value) == said


def test_unknown_option_names_installed_ones_and_pip_install():
    with pytest.raises(UnknownOptionError) as err:
        compose_config(["+raas=tpu_magic"])
    message = str(err.value)
    assert "hf" in message and "pip install astraflow-plugin-raas-tpu-magic" in message


@pytest.mark.parametrize("overrides", [
    ["+experiment=lora"],
    ["+experiment=lora", "+trainer=hf", "+raas=vllm"],
    ["trainer=hf", "+experiment=lora"],
])
def test_an_experiment_sets_values_inside_other_groups(overrides):
    """+experiment=lora sets trainer.lr and trainer.lora: the trainer option, named or
    the default, must not put its own defaults back over them."""
    cfg = compose_config(overrides)
    assert cfg.trainer.lora.rank == 16 and cfg.trainer.lr == pytest.approx(2e-3)
    assert "lm_head" in cfg.trainer.lora.target_modules
    # a value on the command line still wins over the experiment's
    assert compose_config([*overrides, "trainer.lr=1e-3"]).trainer.lr == pytest.approx(1e-3)


def test_a_path_from_the_home_directory_is_expanded_as_the_shell_would():
    import os

    from astraflow.config import compose_config

    cfg = compose_config(["model.path=~/models/Qwen2.5-0.5B-Instruct"])
    assert cfg.model.path == os.path.expanduser("~/models/Qwen2.5-0.5B-Instruct")


def test_one_path_where_a_list_of_paths_is_taken_is_that_list():
    cfg = compose_config(["task=jsonl", "task.train_files=data/train.jsonl",
                          "task.eval_files=[a.jsonl,b.jsonl]"])
    assert list(cfg.task.train_files) == ["data/train.jsonl"]
    assert list(cfg.task.eval_files) == ["a.jsonl", "b.jsonl"]


def test_a_plugins_config_declares_what_values_it_accepts():
    """A plugin's config dataclass uses ``setting`` as the core's do: bounds, choices."""
    from dataclasses import dataclass

    from omegaconf import OmegaConf

    from astraflow.config import check_values, setting

    @dataclass
    class EngineConfig:
        name: str = "mine"
        dtype: str = setting("float32", choices=("float32", "bfloat16"))
        gpu_memory_utilization: float = setting(0.9, gt=0, le=1)
        max_num_seqs: int | None = setting(None, ge=1)

    def wrong(**values):
        node = OmegaConf.merge(OmegaConf.structured(EngineConfig), values)
        return check_values(node, EngineConfig, "raas.")

    assert wrong() == []
    assert wrong(max_num_seqs=None, gpu_memory_utilization=1.0) == []
    assert wrong(dtype="fp8") == ["raas.dtype=fp8: choose float32 or bfloat16"]
    assert wrong(gpu_memory_utilization=0.0, max_num_seqs=0) == [
        "raas.gpu_memory_utilization=0.0: must be > 0", "raas.max_num_seqs=0: must be >= 1"]


def test_a_roles_own_settings_are_set_as_the_docs_write_them():
    """``policies.verifier.lr=1e-3`` (the role is no key of the map until then), with or
    without ``+``; the role starts from ``policies.policy``, as a role not named does."""
    cfg = compose_config(["workflow=solve_verify", "policies.verifier.lr=1e-3",
                          "+policies.verifier.world_size=2", "policies.policy.max_staleness=5",
                          "++policies.solver.advantage=rloo"])
    assert dict(cfg.policies.verifier) == {"max_staleness": 5, "lr": 1e-3, "world_size": 2,
                                           "advantage": "grpo"}
    assert (cfg.policies.solver.advantage, cfg.policies.solver.max_staleness) == ("rloo", 5)
    assert cfg.policies.policy.max_staleness == 5


@pytest.mark.parametrize(("override", "said"), [
    ("policies.verifier.max_stale=4", "policies.verifier.max_stale is not a setting; "
     "policies.verifier has: max_staleness, lr, world_size, advantage (did you mean "
     "max_staleness?)"),
    ("policies.verifier.world_size=0", "policies.verifier.world_size=0: must be >= 1"),
    ("policies.verifier.world_size=two", "policies.verifier.world_size=two: Value 'two'"),
])
def test_a_roles_wrong_setting_is_one_line(override, said):
    with pytest.raises(ConfigError) as err:
        compose_config(["workflow=solve_verify", override])
    assert str(err.value).startswith(said) and "\n" not in str(err.value)


def test_a_roles_trainer_layout_is_judged_under_its_own_key():
    """The trainer's check runs on each role's own world_size before anything starts; its
    message names the key the user set, not ``trainer.world_size``."""
    from astraflow.launch import preflight

    cfg = compose_config(["workflow=solve_verify", "trainer=megatron",
                          "trainer.tensor_model_parallel_size=2",
                          "policies.verifier.world_size=3", "trainer.world_size=2"])
    with pytest.raises(ConfigError) as err:
        preflight.check_backends(cfg)
    assert str(err.value).startswith("policies.verifier.world_size=3 is not a multiple of "
                                     "tensor_model_parallel_size")
    preflight.check_backends(compose_config(["workflow=solve_verify", "trainer=megatron",
                                             "trainer.tensor_model_parallel_size=2",
                                             "policies.verifier.world_size=4",
                                             "trainer.world_size=2"]))
