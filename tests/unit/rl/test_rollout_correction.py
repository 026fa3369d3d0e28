"""``trainer.rollout_correction``: truncated / masked importance weights against the
rollout engine's log-probs, and the engine-vs-trainer gap metrics (hand-computed values).
"""

import math
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from astraflow.config import compose_config
from astraflow.errors import ConfigError
from astraflow.rl.losses import policy_loss


def _row(*values: float) -> torch.Tensor:
    return torch.tensor([list(values)], dtype=torch.float64)


def _loss_and_grad(ratios: list[float], advantages: list[float], mode: str,
                   clip: tuple[float, float] | None) -> tuple[float, list[float]]:
    logp = _row(*(math.log(r) for r in ratios)).requires_grad_()
    out = policy_loss(logp, torch.zeros_like(logp), _row(*advantages),
                      torch.ones(1, len(ratios)), clip=clip, correction=mode, cap=2.0)
    (grad,) = torch.autograd.grad(out.loss, logp)
    return out.loss.item(), grad[0].tolist()


# ratios 0.25, 1, 3 with A = -1, then with A = +1; PPO clip (0.2, 0.28), cap 2, 6 tokens.
# d(-A * w)/dlogp = -A * w for a weight w that passes gradient (ratio, or min(ratio, 2)).
#   A=-1 r=0.25: r < 0.8, clipped: value 0.8, no gradient (every mode)
#   A=-1 r=1:    value 1, gradient 1 (every mode)
#   A=-1 r=3:    not clipped (A<0 clips only low ratios): none 3 / 3; tis 2 / 2; mis 0 / 0
#   A=+1 r=0.25: value -0.25, gradient -0.25 (every mode)
#   A=+1 r=1:    value -1, gradient -1 (every mode)
#   A=+1 r=3:    r > 1.28, clipped: value -1.28, no gradient; mis masks it: value 0
# none: (0.8 + 1 + 3 - 0.25 - 1 - 1.28) / 6 = 2.27 / 6
# tis:  (0.8 + 1 + 2 - 0.25 - 1 - 1.28) / 6 = 1.27 / 6
# mis:  (0.8 + 1 + 0 - 0.25 - 1 + 0) / 6    = 0.55 / 6
PPO_RATIOS, PPO_ADVANTAGES = [0.25, 1.0, 3.0, 0.25, 1.0, 3.0], [-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(("mode", "loss", "grad"), [
    ("none", 2.27 / 6, [0.0, 1 / 6, 3 / 6, -0.25 / 6, -1 / 6, 0.0]),
    ("tis", 1.27 / 6, [0.0, 1 / 6, 2 / 6, -0.25 / 6, -1 / 6, 0.0]),
    ("mis", 0.55 / 6, [0.0, 1 / 6, 0.0, -0.25 / 6, -1 / 6, 0.0]),
])
def test_ppo_with_a_rollout_correction_bounds_the_weight_of_a_penalised_token(mode, loss, grad):
    got_loss, got_grad = _loss_and_grad(PPO_RATIOS, PPO_ADVANTAGES, mode, clip=(0.2, 0.28))
    assert got_loss == pytest.approx(loss)
    assert got_grad == pytest.approx(grad)


# M2PO's clip: a wide bound such as (0.5, 1.5), or None (inside its trust region); 4 tokens
#   A=+1 r=3:   clip: 3 > 2.5, clipped on the untruncated ratio: value -2.5, no gradient
#               (tis does not turn it into a gradient; mis masks it: 0); None: like A<0 r=3
#   A=+1 r=2.2: 2.2 < 2.5, kept: none -2.2 / -2.2; tis -2 / -2; mis 0 / 0
#   A=-1 r=3:   none 3 / 3; tis 2 / 2; mis 0 / 0
#   A=+1 r=1:   -1 / -1 (every mode)
# clip (0.5, 1.5): none (-2.5 - 2.2 + 3 - 1) / 4 = -2.7 / 4; tis (-2.5 - 2 + 2 - 1) / 4; mis -1/4
# unclipped:       none (-3 - 2.2 + 3 - 1) / 4 = -3.2 / 4;   tis (-2 - 2 + 2 - 1) / 4;   mis -1/4
@pytest.mark.parametrize(("clip", "mode", "loss", "grad"), [
    ((0.5, 1.5), "none", -2.7 / 4, [0.0, -2.2 / 4, 3 / 4, -1 / 4]),
    ((0.5, 1.5), "tis", -3.5 / 4, [0.0, -2 / 4, 2 / 4, -1 / 4]),
    ((0.5, 1.5), "mis", -1 / 4, [0.0, 0.0, 0.0, -1 / 4]),
    (None, "none", -3.2 / 4, [-3 / 4, -2.2 / 4, 3 / 4, -1 / 4]),
    (None, "tis", -3 / 4, [-2 / 4, -2 / 4, 2 / 4, -1 / 4]),
    (None, "mis", -1 / 4, [0.0, 0.0, 0.0, -1 / 4]),
])
def test_m2po_bounds_and_unclipped_m2po_are_corrected_too(clip, mode, loss, grad):
    got_loss, got_grad = _loss_and_grad([3.0, 2.2, 3.0, 1.0], [1.0, 1.0, -1.0, 1.0], mode, clip)
    assert got_loss == pytest.approx(loss)
    assert got_grad == pytest.approx(grad)


def test_corrections_keep_the_gradient_finite_when_the_engine_log_prob_underflows():
    # old_logp = -1000: the ratio overflows to inf. none: the A<0 token's loss is inf;
    # tis weighs it 2 (gradient 2 / 2 tokens), mis drops it
    logp = _row(-1.0, -1.0).requires_grad_()
    old = _row(-1000.0, -1.0)
    for mode, expected in (("tis", [1.0, -0.5]), ("mis", [0.0, -0.5])):
        out = policy_loss(logp, old, _row(-1.0, 1.0), torch.ones(1, 2), clip=(0.2, 0.28),
                          correction=mode, cap=2.0)
        (grad,) = torch.autograd.grad(out.loss, logp)
        assert grad[0].tolist() == pytest.approx(expected)
    out = policy_loss(logp, old, _row(-1.0, 1.0), torch.ones(1, 2), clip=(0.2, 0.28))
    assert out.loss.item() == math.inf


def test_gap_metrics_count_trained_tokens_beyond_the_cap_either_way():
    # trained gaps: ln 3 (r=3 > 2), -ln 4 (r=0.25 < 1/2), 0.1, -0.5 (inside [1/2, 2]);
    # the masked token's garbage (nan, a gap of 9) counts nowhere
    logp = _row(math.log(3.0), math.log(0.25), 0.1, -0.5, 9.0)
    old = _row(0.0, 0.0, 0.0, 0.0, float("nan"))
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    advantages = _row(1.0, -1.0, 1.0, 1.0, 1.0)
    for mode, corrected in (("none", 0), ("tis", 1), ("mis", 1)):
        out = policy_loss(logp, old, advantages, mask, clip=(0.2, 0.28), correction=mode)
        assert float(out.beyond_cap) == 2
        assert float(out.corrected_tokens) == corrected  # only r=3 is above the cap
        assert float(out.gap_max) == pytest.approx(math.log(4.0))


def test_an_unknown_correction_is_refused_by_the_loss():
    with pytest.raises(ValueError, match="'tls'"):
        policy_loss(_row(0.0), _row(0.0), _row(1.0), torch.ones(1, 1), clip=None,
                    correction="tls")


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.rollout_correction=xyz", "trainer.rollout_correction=xyz: choose none, tis or mis"),
    ("trainer.rollout_correction_cap=1", "trainer.rollout_correction_cap=1.0: must be > 1"),
    ("trainer.rollout_correction_cap=0.5", "trainer.rollout_correction_cap=0.5: must be > 1"),
])
def test_the_config_refuses_a_bad_correction_from_the_command_line(override, message):
    """Declared with the settings: refused as the config is composed, in one line."""
    with pytest.raises(ConfigError) as info:
        compose_config([override])
    assert str(info.value) == message


@pytest.mark.parametrize("trainer", ["hf", "megatron"])
def test_every_trainer_takes_the_correction_from_the_command_line(trainer):
    cfg = compose_config([f"trainer={trainer}", "trainer.rollout_correction=tis",
                          "trainer.rollout_correction_cap=3"])
    assert (cfg.trainer.rollout_correction, cfg.trainer.rollout_correction_cap) == ("tis", 3.0)
    assert compose_config([f"trainer={trainer}"]).trainer.rollout_correction == "none"


# -- one train step of trainer=hf on the tiny model ---------------------------------------

SHIFT = 2.0  # the engine's log-probs of the penalised item, lowered: ratio e^2 = 7.39 > 2


def _step(tiny_model_dir: str, mode: str) -> tuple[dict[str, float], dict[str, Any], float]:
    from astraflow.plugins import get_registry
    from astraflow.testing.trainer import arithmetic_batch, with_behaviour_logprobs

    entry = get_registry().get("trainer_backend", "hf")
    config = OmegaConf.merge(OmegaConf.structured(entry.config_cls),
                             {"rollout_correction": mode, "lr": 1e-4})
    backend = entry.create(config, tiny_model_dir)
    batch = with_behaviour_logprobs(backend, arithmetic_batch(tiny_model_dir, [1.0, -1.0, 0.5]))
    shifted = batch.items[1].trajectory
    shifted.logprobs = [lp - SHIFT if m else lp
                        for lp, m in zip(shifted.logprobs, shifted.loss_mask, strict=True)]
    # the trainer holds version 1: item 0 was generated by it, the others by version 0
    batch.trainer_version = 1
    fresh = batch.items[0].trajectory
    fresh.versions = [1 if m else v for v, m in zip(fresh.versions, fresh.loss_mask, strict=True)]
    metrics = backend.train_step(batch)
    return metrics, backend.export_weights(), sum(shifted.loss_mask) / metrics["tokens"]


def test_train_step_reports_the_gap_and_truncation_changes_the_update(tiny_model_dir):
    (none, none_weights, share), (tis, tis_weights, _), (mis, _, _) = (
        _step(tiny_model_dir, mode) for mode in ("none", "tis", "mis"))
    for metrics in (none, tis, mis):
        assert metrics["rollout_logprob_gap_max"] == pytest.approx(SHIFT, abs=1e-3)
        assert metrics["rollout_beyond_cap_fraction"] == pytest.approx(share)
        # only the untouched, fresh item: the trainer's own log-probs, no staleness
        assert metrics["rollout_logprob_gap_fresh"] == pytest.approx(0.0, abs=1e-4)
        assert metrics["logprob_abs_diff"] == pytest.approx(SHIFT * share, rel=1e-3)
    assert none["rollout_corrected_fraction"] == 0.0
    assert tis["rollout_corrected_fraction"] == mis["rollout_corrected_fraction"] == share
    # the shifted item's tokens (A = -1) weigh e^2 per token without a correction, 2 with
    # tis and 0 with mis; every other token weighs the same in all three
    assert none["loss"] - tis["loss"] == pytest.approx(share * (math.exp(SHIFT) - 2), rel=1e-3)
    assert none["loss"] - mis["loss"] == pytest.approx(share * math.exp(SHIFT), rel=1e-3)
    assert any(not torch.equal(none_weights[k], tis_weights[k]) for k in none_weights)
