"""How off-policy a batch is, at any batch size: the effective sample size of its
sequences' importance weights and KL(behaviour || trainer), and VCPO's ESS-scaled step
(``trainer.ess_lr_power``)."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from astraflow.config import compose_config
from astraflow.rl.policy_gradient import ess_fraction, importance_sums


def _sums(log_ratios: list[list[float]], mask: list[list[int]]) -> dict[str, float]:
    logp = torch.tensor(log_ratios, dtype=torch.float64)
    return importance_sums(logp, torch.zeros_like(logp), torch.tensor(mask, dtype=torch.float64))


def test_on_policy_sequences_have_a_full_sample_and_no_kl():
    sums = _sums([[0.0, 0.0, 0.0]] * 4, [[0, 1, 1]] * 4)
    assert sums["sequences"] == 4
    assert ess_fraction(sums) == pytest.approx(1.0)
    assert sums["offpolicy_kl"] == pytest.approx(0.0)


def test_one_sequence_that_dominates_leaves_an_effective_sample_of_about_one():
    # sequence weights: e^(0.5 + 0.5) = e for the first, 1 for the other three; the
    # prompt column (mask 0) is left out whatever it holds
    sums = _sums([[9.0, 0.5, 0.5], [9.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]],
                 [[0, 1, 1]] * 4)
    e = math.e
    assert ess_fraction(sums) == pytest.approx((e + 3) ** 2 / (4 * (e * e + 3)))
    # k3 per trained token: e^r - r - 1, two tokens at r = 0.5, six at 0
    assert sums["offpolicy_kl"] == pytest.approx(2 * (math.exp(0.5) - 1.5))
    # the same shift on a far larger batch reads the same when it is the same share
    many = _sums([[0.0, 0.5, 0.5]] * 25 + [[0.0, 0.0, 0.0]] * 75, [[0, 1, 1]] * 100)
    few = _sums([[0.0, 0.5, 0.5]] * 1 + [[0.0, 0.0, 0.0]] * 3, [[0, 1, 1]] * 4)
    assert ess_fraction(many) == pytest.approx(ess_fraction(few))
    # a weight of e^1000 does not overflow: that one sequence is the whole sample
    huge = _sums([[0.0, 1000.0]] + [[0.0, 0.0]] * 9, [[0, 1]] * 10)
    assert ess_fraction(huge) == pytest.approx(0.1, rel=1e-6)


def test_rows_with_no_trained_token_are_not_sequences():
    sums = _sums([[3.0, 3.0], [0.0, 0.0]], [[0, 0], [1, 1]])
    assert sums["sequences"] == 1
    assert ess_fraction(sums) == 1.0
    assert ess_fraction({"sequences": 0, "weight_sum": 0.0, "weight_sq_sum": 0.0}) == 1.0


def test_the_command_line_sets_the_ess_scaled_step_and_refuses_a_negative_power():
    from astraflow.errors import ConfigError

    assert compose_config(["trainer.ess_lr_power=0.5"]).trainer.ess_lr_power == 0.5
    assert compose_config([]).trainer.ess_lr_power == 0.0
    with pytest.raises(ConfigError, match="ess_lr_power"):
        compose_config(["trainer.ess_lr_power=-1"])


def test_a_train_step_reports_the_gauge_and_an_off_policy_batch_takes_a_smaller_step(
        tiny_model_dir):
    from astraflow.plugins import get_registry
    from astraflow.testing.trainer import arithmetic_batch, with_behaviour_logprobs

    entry = get_registry().get("trainer_backend", "hf")
    config = OmegaConf.merge(OmegaConf.structured(entry.config_cls),
                             {"ess_lr_power": 0.5, "lr": 1e-4, "lr_schedule": "constant"})
    backend = entry.create(config, tiny_model_dir)

    def step(shift: float) -> dict[str, float]:
        batch = with_behaviour_logprobs(backend, arithmetic_batch(tiny_model_dir,
                                                                  [1.0, -1.0, 0.5, -0.5]))
        stale = batch.items[0].trajectory  # an older behaviour: its tokens less likely
        stale.logprobs = [lp - shift if m else lp
                          for lp, m in zip(stale.logprobs, stale.loss_mask, strict=True)]
        return backend.train_step(batch)

    fresh = step(0.0)
    assert fresh["ess_fraction"] == pytest.approx(1.0, abs=1e-4)
    assert fresh["offpolicy_kl"] == pytest.approx(0.0, abs=1e-6)
    assert fresh["lr"] == pytest.approx(1e-4, rel=1e-3)
    stale = step(0.5)
    assert 0.25 < stale["ess_fraction"] < 0.95
    assert stale["offpolicy_kl"] > 0.01
    assert stale["lr"] == pytest.approx(1e-4 * stale["ess_fraction"] ** 0.5, rel=1e-6)
    backend.config.ess_lr_power = 0.0  # the option off: the gauge, not the step
    unscaled = step(0.5)
    assert unscaled["ess_fraction"] < 0.95
    assert unscaled["lr"] == pytest.approx(1e-4)
