"""Learning-rate schedules shared by every trainer backend (hand-computed values)."""

import pytest
from omegaconf import OmegaConf

from astraflow.components import trainer_settings
from astraflow.rl.options import PolicyGradientOptions, lr_at


def rates(steps: int, **options: object) -> list[float]:
    opts = PolicyGradientOptions(lr=1.0, **options)
    return [lr_at(opts, step) for step in range(steps)]


def test_constant_schedule_keeps_the_rate_after_warmup():
    got = rates(5, lr_schedule="constant", warmup_steps=2, total_steps=5)
    assert got == [0.5, 1.0, 1.0, 1.0, 1.0]


def test_linear_schedule_reaches_the_floor_at_total_steps_and_stays_there():
    got = rates(7, lr_schedule="linear", total_steps=4, min_lr_ratio=0.2)
    assert got == pytest.approx([1.0, 0.8, 0.6, 0.4, 0.2, 0.2, 0.2])


def test_cosine_schedule_is_halfway_at_the_middle_of_the_decay():
    got = rates(5, lr_schedule="cosine", warmup_steps=1, total_steps=5, min_lr_ratio=0.0)
    assert got == pytest.approx([1.0, 1.0, 0.8535534, 0.5, 0.1464466])


def test_unknown_schedule_is_named_in_the_error():
    with pytest.raises(ValueError, match="lr_schedule='cosnie'"):
        lr_at(PolicyGradientOptions(lr_schedule="cosnie"), 0)


def test_a_schedule_spans_the_run_unless_told_otherwise():
    cfg = OmegaConf.create({"steps": 600, "policies": {"policy": {"lr": None}},
                            "trainer": {"lr": 2e-4, "total_steps": 0}})
    assert trainer_settings(cfg, "policy").total_steps == 600
    cfg.trainer.total_steps = 50
    assert trainer_settings(cfg, "policy").total_steps == 50


def test_the_launcher_refuses_an_unknown_schedule_before_starting_anything():
    from astraflow.config import compose_config
    from astraflow.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        compose_config(["trainer.lr_schedule=cosnie"])
    assert str(info.value) == "trainer.lr_schedule=cosnie: choose constant, linear or cosine"
