"""The service's settings come from the run config (launcher) or a resolved YAML (CLI)."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from astraflow.config import AstraFlowConfig, PolicyConfig
from astraflow.dataflow.settings import DataflowSettings, settings_from_config, settings_from_yaml
from astraflow.errors import ConfigError


def test_settings_from_run_config(tmp_path):
    cfg = OmegaConf.structured(AstraFlowConfig(
        run_dir=str(tmp_path), group_size=4, batch_size=16,
        policies={"solver": PolicyConfig(max_staleness=1, advantage="rloo"),
                  "verifier": PolicyConfig()},
        data={"dynamic_sampling": {"name": "dynamic_sampling", "tolerance": 0.0}},
    ))
    cfg.task = {"name": "arithmetic", "max_operand": 5}
    cfg.dataflow.order = "edf"
    s = settings_from_config(cfg)
    assert s.store == str(tmp_path / "store")
    assert s.policies == {"solver": 1, "verifier": PolicyConfig().max_staleness}
    assert s.advantages == {"solver": "rloo", "verifier": "grpo"}
    assert (s.group_size, s.batch_size, s.order) == (4, 16, "edf")
    assert s.task == {"name": "arithmetic", "max_operand": 5}
    assert s.data == {"dynamic_sampling": {"name": "dynamic_sampling", "tolerance": 0.0}}

    resolved = tmp_path / "resolved.yaml"
    resolved.write_text(OmegaConf.to_yaml(cfg))
    assert settings_from_yaml(resolved) == s


def test_bad_settings_say_what_is_wrong(tmp_path):
    cfg = OmegaConf.structured(AstraFlowConfig())
    with pytest.raises(ConfigError, match="store"):
        settings_from_config(cfg)
    cfg.dataflow.order = "lifo"
    with pytest.raises(ConfigError, match="order"):
        settings_from_config(cfg, store=str(tmp_path))


def test_a_data_layer_started_alone_has_the_run_configs_defaults(tmp_path):
    """``astraflow dataflow --store DIR`` serves as a launched run's data layer does: the
    settings both have take one default and one range, from the run config's schema."""
    alone = DataflowSettings(store=str(tmp_path))
    launched = settings_from_config(OmegaConf.structured(AstraFlowConfig(run_dir=str(tmp_path))))
    assert alone == dataclasses.replace(launched, store=str(tmp_path), task=None)
    assert (alone.batch_size, alone.policies) == (AstraFlowConfig().batch_size,
                                                  {"policy": PolicyConfig().max_staleness})
    with pytest.raises(ConfigError, match=r"^dataflow.lease_seconds=0: must be > 0$"):
        DataflowSettings(store=str(tmp_path), lease_seconds=0)
    with pytest.raises(ConfigError, match=r"^policies.solver.max_staleness=-1: must be >= 0"):
        DataflowSettings(store=str(tmp_path), policies={"solver": -1})


def test_the_standalone_flags_are_the_settings_with_the_schemas_defaults(tmp_path):
    """``astraflow dataflow``'s flags come from the settings: each has one, its help
    states the run config's default, and a policy named without a bound gets the derived
    one (the run's default) -- no flag list or default kept by hand beside the schema."""
    import argparse

    from astraflow.config import DataflowConfig
    from astraflow.dataflow.cli import _parser, _settings

    parser = _parser()
    flags = {a.dest: a for a in parser._actions if isinstance(a, argparse.Action)}
    scalar = [f.name for f in dataclasses.fields(DataflowSettings)
              if isinstance(f.default, int | float | str) and f.name != "hot_routes"]
    assert scalar and all(name in flags for name in scalar)
    assert f"default {DataflowConfig().lease_seconds}" in flags["lease_seconds"].help
    assert "derived" in flags["policy"].help

    args = parser.parse_args(["--store", str(tmp_path), "--lease-seconds", "7",
                              "--overload-lag", "0", "--policy", "solver", "--policy", "v=3"])
    got = _settings(args)
    assert (got.lease_seconds, got.overload_lag) == (7.0, 0.0)
    assert got.policies == {"solver": PolicyConfig().max_staleness, "v": 3}
    with pytest.raises(ConfigError, match=r"lease_seconds=0.0: must be > 0"):
        _settings(parser.parse_args(["--store", str(tmp_path), "--lease-seconds", "0"]))
