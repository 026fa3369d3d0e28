"""The shared policy losses against values computed by hand."""

import math

import pytest
import torch

from astraflow.rl.losses import m2po_clip, policy_loss, token_entropy, token_logprobs


def _row(*values: float) -> torch.Tensor:
    return torch.tensor([list(values)], dtype=torch.float64)


def test_token_logprobs_align_each_token_with_the_logits_before_it():
    # vocab of 2; position 0 predicts token 1 with p = 3/4, position 1 predicts token 2
    logits = torch.tensor([[[math.log(3.0), 0.0], [0.0, 0.0], [5.0, -5.0]]])
    tokens = torch.tensor([[1, 0, 1]])
    logp = token_logprobs(logits, tokens)
    assert logp.shape == (1, 3)
    assert logp[0, 0] == 0.0
    assert logp[0, 1] == pytest.approx(math.log(3 / 4))
    assert logp[0, 2] == pytest.approx(math.log(0.5))


def test_token_logprobs_match_a_full_log_softmax_in_bfloat16_logits():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11).to(torch.bfloat16)
    tokens = torch.randint(0, 11, (3, 7))
    expected = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, tokens[:, 1:, None])
    assert torch.allclose(token_logprobs(logits, tokens)[:, 1:], expected.squeeze(-1), atol=1e-6)


def test_token_entropy_of_a_uniform_prediction_is_log_vocab():
    entropy = token_entropy(torch.zeros(1, 3, 8))
    assert entropy[0, 0] == 0.0
    assert torch.allclose(entropy[0, 1:], torch.full((2,), math.log(8.0)))


def test_at_ratio_one_the_ppo_gradient_is_the_policy_gradient():
    torch.manual_seed(0)
    logp = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    advantages = torch.tensor([[1.5], [-0.5], [0.0]], dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 1, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    out = policy_loss(logp, logp.detach(), advantages, mask, clip=(0.2, 0.28))
    (grad,) = torch.autograd.grad(out.loss, logp)
    reinforce = -(advantages * logp * mask).sum() / mask.sum()
    (expected,) = torch.autograd.grad(reinforce, logp)
    assert torch.allclose(grad, expected)
    assert float(out.ratio_sum) == pytest.approx(11.0)
    assert float(out.clipped_tokens) == 0


def test_ppo_clips_only_where_the_ratio_leaves_the_trust_region_in_the_rewarded_direction():
    # tokens: A>0 r=1.5 (clipped at 1.28), A>0 r=0.5 (kept), A<0 r=0.5 (clipped at 0.8),
    # A<0 r=1.5 (kept: the pessimistic term is the unclipped one)
    ratios = [1.5, 0.5, 0.5, 1.5]
    logp = _row(*(math.log(r) for r in ratios)).requires_grad_()
    advantages = _row(1.0, 1.0, -1.0, -1.0)
    out = policy_loss(logp, torch.zeros_like(logp), advantages, torch.ones(1, 4), clip=(0.2, 0.28))
    assert out.loss.item() == pytest.approx((-1.28 - 0.5 + 0.8 + 1.5) / 4)
    assert float(out.clipped_tokens) == 2
    (grad,) = torch.autograd.grad(out.loss, logp)
    # d/dlogp of -A * ratio is -A * ratio; clipped tokens get none
    assert grad[0].tolist() == pytest.approx([0.0, -0.5 / 4, 0.0, 1.5 / 4])


def test_without_clipping_every_ratio_passes_gradient():
    logp = _row(math.log(3.0), math.log(0.1)).requires_grad_()
    out = policy_loss(logp, torch.zeros_like(logp), _row(1.0, -2.0), torch.ones(1, 2), clip=None)
    assert out.loss.item() == pytest.approx((-3.0 + 0.2) / 2)
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert grad[0].tolist() == pytest.approx([-3.0 / 2, 0.2 / 2])


def test_masked_tokens_do_not_reach_the_loss_even_when_they_hold_garbage():
    logp = _row(-1.0, -2.0, -3.0).requires_grad_()
    old = _row(-1.0, float("nan"), float("inf"))
    mask = torch.tensor([[1, 0, 0]])
    out = policy_loss(logp, old, _row(2.0, float("inf"), 1.0), mask, clip=(0.2, 0.2))
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert out.loss.item() == pytest.approx(-2.0)
    assert grad.tolist() == [[-2.0, 0.0, 0.0]]


def test_micro_batch_losses_normalised_by_batch_tokens_add_up_to_the_batch_loss():
    torch.manual_seed(1)
    logp, old = torch.randn(4, 6), torch.randn(4, 6)
    advantages, mask = torch.randn(4, 1), (torch.rand(4, 6) > 0.3).float()
    whole = policy_loss(logp, old, advantages, mask, clip=(0.2, 0.28)).loss
    n = float(mask.sum())
    halves = [
        policy_loss(logp[s], old[s], advantages[s], mask[s], clip=(0.2, 0.28), num_tokens=n).loss
        for s in (slice(0, 2), slice(2, 4))
    ]
    assert float(sum(halves)) == pytest.approx(float(whole), rel=1e-6)


def test_k3_kl_penalty_against_the_reference():
    # ref - logp = ln 2: k3 = 2 - ln 2 - 1, d k3 / d logp = 1 - 2 = -1
    logp = _row(-1.0).requires_grad_()
    ref = logp.detach() + math.log(2.0)
    out = policy_loss(
        logp,
        logp.detach(),
        _row(0.0),
        torch.ones(1, 1),
        clip=(0.2, 0.2),
        ref_logp=ref,
        kl_coef=0.5,
    )
    assert float(out.kl_sum) == pytest.approx(1.0 - math.log(2.0))
    assert out.loss.item() == pytest.approx(0.5 * (1.0 - math.log(2.0)))
    (grad,) = torch.autograd.grad(out.loss, logp)
    assert grad.item() == pytest.approx(-0.5)


def _m2po_batch(
    log_ratios: list[float], advantages: list[float], mask: list[int] | None = None
) -> tuple[torch.Tensor, ...]:
    logp = _row(*log_ratios)
    trained = torch.tensor([mask or [1] * len(log_ratios)])
    return logp, torch.zeros_like(logp), _row(*advantages), trained


def test_m2po_does_not_clip_a_batch_inside_the_trust_region():
    # m2 over T = (0.05^2 + 0.08^2) / 2 = 0.00445 <= 0.01; the -2.0 token is not in T
    assert m2po_clip(*_m2po_batch([0.05, -0.08, -2.0], [1.0, -1.0, 1.0])) is None


def test_m2po_does_not_clip_when_no_token_moves_in_its_rewarded_direction():
    assert m2po_clip(*_m2po_batch([-3.0, 3.0], [1.0, -1.0])) is None


def test_m2po_bound_drops_the_largest_second_moments_until_the_rest_is_under_tau():
    # T: +0.5 (A>0), -0.2 (A<0), +0.05, +0.01 -> m2 sorted 0.25, 0.04, 0.0025, 0.0001.
    # mean(all) = 0.0731; mean(sorted[1:]) = 0.0142; mean(sorted[2:]) = 0.0013 < 0.01
    # -> t = sqrt(0.0025) = 0.05. Not in T: A<0 with +3.0, masked A>0 with +4.0.
    batch = _m2po_batch(
        [0.5, -0.2, 0.05, 0.01, 3.0, 4.0], [1.0, -1.0, 2.0, 1.0, -1.0, 1.0], [1, 1, 1, 1, 1, 0]
    )
    eps_low, eps_high = m2po_clip(*batch)
    assert eps_low == pytest.approx(1 - math.exp(-0.05))
    assert eps_high == pytest.approx(math.exp(0.05) - 1)
    logp, old, advantages, mask = batch
    out = policy_loss(logp, old, advantages, mask, clip=(eps_low, eps_high))
    assert float(out.clipped_tokens) == 2  # the +0.5 and -0.2 outliers


def test_m2po_bounds_are_capped():
    # an outlier (m2 100) over tau; the rest has mean m2 < tau but holds a 3.1 log ratio:
    # t = 3.1 -> 1 - exp(-3.1) = 0.955 capped to 0.95, exp(3.1) - 1 = 21.2 capped to 20
    log_ratios = [10.0, 3.1] + [1e-3] * 2000
    assert m2po_clip(*_m2po_batch(log_ratios, [1.0] * len(log_ratios))) == (0.95, 20.0)


def test_m2po_clips_all_of_t_when_every_token_alone_exceeds_tau():
    assert m2po_clip(*_m2po_batch([0.3, 0.2], [1.0, 1.0])) == (0.0, 0.0)
