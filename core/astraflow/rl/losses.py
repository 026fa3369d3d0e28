"""Per-token policy losses shared by every trainer backend (imports torch).

Tensors are ``[B, T]`` and aligned with the token ids: entry ``i`` concerns
``token_i`` given ``tokens_<i``. ``mask`` is 1 on trained tokens. Masked-out entries
never reach the loss or its gradient, whatever garbage they hold, so a trainer can
pass padding and other policies' tokens through unchanged.

Every loss is a token mean over the *whole* batch: a backend that accumulates
gradients over micro-batches passes the batch's trained-token count as
``num_tokens``, and the sum of the micro-batch losses is then exactly the loss of the
whole batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from astraflow.rl.options import CORRECTIONS

#: M2PO's bound on the second moment of the log importance ratio
M2PO_TAU = 0.01
_M2PO_MAX_EPS_LOW = 0.95
_M2PO_MAX_EPS_HIGH = 20.0
#: what ``policy_loss`` does to importance weights above ``cap``: nothing, truncate, mask


def token_logprobs(logits: Tensor, tokens: Tensor, start: int = 0) -> Tensor:
    """log p(token_i | tokens_<i) from causal-LM logits; column 0 is 0.0.

    ``logits`` are those of columns ``start`` to ``start + K`` of ``tokens`` (all of
    them by default): a trainer that computes logits only where tokens are trained
    (:func:`trained_columns`) gets log-probs there and 0.0 elsewhere. Gathers the target
    logit and subtracts a logsumexp instead of materialising a full log-softmax: one
    float32 ``[B, K, V]`` temporary at most.
    """
    width = tokens.shape[1]
    targets = tokens[:, start + 1 : start + 1 + logits.shape[1]]
    shifted = logits[:, : targets.shape[1]].float()
    logp = shifted.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(shifted,
                                                                                   dim=-1)
    return torch.nn.functional.pad(logp, (start + 1, width - start - 1 - logp.shape[1]),
                                   value=0.0)


@torch.no_grad()
def token_entropy(logits: Tensor, start: int = 0, width: int | None = None) -> Tensor:
    """Entropy of the distribution each token was predicted from; column 0 is 0.0.

    ``logits``: as :func:`token_logprobs` takes them; ``width``: the tokens' ``T`` (by
    default, the logits' columns). One row at a time: a ``[K, V]`` temporary at most.
    """
    width = logits.shape[1] if width is None else width
    used = logits[:, : max(0, min(logits.shape[1], width - start - 1))]
    rows = [entropy(row) for row in used] if used.shape[1] else []
    out = torch.stack(rows) if rows else logits.new_zeros(logits.shape[0], 0,
                                                          dtype=torch.float32)
    return torch.nn.functional.pad(out, (start + 1, width - start - 1 - out.shape[1]),
                                   value=0.0)


def entropy(logits: Tensor) -> Tensor:
    """The entropy of each distribution over the last dimension, in float32."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def trained_columns(mask: Tensor) -> tuple[int, int] | None:
    """``(start, stop)``: the logit columns a loss over ``mask``'s tokens reads (column
    ``j - 1`` predicts token ``j``); None when no token is trained.

    A completion of 8 tokens after a prompt of 200 needs 8 of 208 columns: at a vocabulary
    of 152k, the other 200 are 120 MB of float32 logits a sequence, and a fifth of the
    model's multiply-adds (the output layer) for nothing.
    """
    trained = mask.bool().any(dim=0).nonzero()
    if trained.numel() == 0:
        return None
    return max(0, int(trained[0]) - 1), int(trained[-1])


@dataclass
class PolicyLoss:
    """The loss to backpropagate and detached per-token *sums* for metrics.

    Sums (not means) so a backend can add them over micro-batches and divide once;
    ``gap_max`` is a maximum, combined with ``max``. ``corrected_tokens`` counts the
    trained tokens whose weight the rollout correction truncated or masked (0 without
    one); ``beyond_cap`` the trained tokens with ratio > cap or < 1 / cap, whatever the
    correction; ``gap_max`` is the largest ``|logp - old_logp|`` over trained tokens.
    """

    loss: Tensor
    clipped_tokens: Tensor
    ratio_sum: Tensor
    kl_sum: Tensor
    corrected_tokens: Tensor
    beyond_cap: Tensor
    gap_max: Tensor


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip: tuple[float, float] | None,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    num_tokens: float | None = None,
    correction: str = "none",
    cap: float = 2.0,
) -> PolicyLoss:
    """PPO-clip / GRPO objective with an optional k3 KL penalty, as a loss to minimise.

    ``ratio = exp(logp - old_logp)`` against the behaviour log-probs. With ``clip =
    (eps_low, eps_high)`` the per-token loss is ``-min(ratio * A, clip(ratio, 1 -
    eps_low, 1 + eps_high) * A)``; with ``clip=None`` it is the unclipped ``-ratio *
    A`` (M2PO when the batch is inside its trust region). ``advantages`` broadcasts
    to ``[B, T]`` (``[B, 1]`` for one advantage per sequence). The KL term is the k3
    estimator ``exp(ref - logp) - (ref - logp) - 1`` against ``ref_logp``.

    ``old_logp`` comes from the rollout engine (its kernels, its precision, maybe older
    weights) and a backend takes one optimiser step per batch, so ``ratio`` is the
    importance weight pi_trainer / pi_engine. The clip bounds it only in the direction
    the advantage rewards: for A < 0 a large ratio makes ``-A * ratio`` unbounded,
    which is how an engine/trainer mismatch blows a run up. ``correction`` bounds it:

    - ``none``: the ratio as is.
    - ``tis`` (truncated IS, Yao et al. 2025): the weight is ``min(ratio, cap)`` in value
      and in gradient (``min(ratio, cap) * dlogp``), i.e. ``ratio * min(1, cap /
      ratio)`` with the factor detached.
    - ``mis`` (masked IS, Liu et al. 2025): a token with ratio > cap contributes
      nothing, value or gradient, but still counts in the token mean.

    Whether PPO (or M2PO's bounds) clips a token is decided on the uncorrected ratio as
    without a correction: a clipped token keeps the clipped value and gets no gradient.
    """
    if correction not in CORRECTIONS:
        raise ValueError(f"rollout correction {correction!r}: choose one of {list(CORRECTIONS)}")
    trained = mask.bool()
    count = float(trained.sum()) if num_tokens is None else float(num_tokens)
    advantages = advantages.expand_as(logp)
    log_ratio = torch.where(trained, logp - old_logp, 0.0)
    ratio = log_ratio.exp()
    log_cap = math.log(cap)
    above = trained & (log_ratio.detach() > log_cap)
    if correction == "tis":  # in log space, so a ratio that overflows still truncates
        weight = (log_ratio - (log_ratio - log_cap).clamp(min=0.0).detach()).exp()
    elif correction == "mis":  # exp never sees a masked token's log-ratio, nor its inf
        weight = torch.where(above, 0.0, log_ratio).exp()
    else:
        weight = ratio
    per_token = -advantages * weight
    clipped = torch.zeros_like(trained)
    if clip is not None:
        eps_low, eps_high = clip
        bounded = -advantages * ratio.detach().clamp(1.0 - eps_low, 1.0 + eps_high)
        clipped = trained & (bounded > -advantages * ratio.detach())
        per_token = torch.where(clipped, bounded, per_token)
    if correction == "mis":
        per_token = torch.where(above, 0.0, per_token)
    kl_sum = logp.new_zeros(())
    if ref_logp is not None and kl_coef:
        ref_delta = torch.where(trained, ref_logp - logp, 0.0)
        kl = ref_delta.exp() - ref_delta - 1.0
        per_token = per_token + kl_coef * kl
        kl_sum = torch.where(trained, kl, 0.0).sum().detach()
    loss = torch.where(trained, per_token, 0.0).sum() / max(count, 1.0)
    gap = log_ratio.detach().abs()
    return PolicyLoss(
        loss=loss,
        clipped_tokens=clipped.sum().detach(),
        ratio_sum=torch.where(trained, ratio, 0.0).sum().detach(),
        kl_sum=kl_sum,
        corrected_tokens=(above if correction != "none" else torch.zeros_like(above)).sum(),
        beyond_cap=(trained & (gap > log_cap)).sum(),
        gap_max=gap.max() if gap.numel() else gap.new_zeros(()),
    )


@torch.no_grad()
def m2po_clip(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, tau: float = M2PO_TAU
) -> tuple[float, float] | None:
    """M2PO's clip bounds from the second moment of the log ratio over the whole batch.

    T = trained tokens whose ratio moves in the direction their advantage rewards
    (A > 0 and ratio > 1, or A < 0 and ratio < 1); m2 = (logp_old - logp)^2. If T is
    empty or mean(m2 over T) <= tau there is no clipping (``None``). Otherwise sort
    m2 over T descending and take the first j with mean(sorted[j:]) < tau: dropping
    the j largest brings the second moment under tau, and t = sqrt(sorted[j]) gives
    ``(min(1 - exp(-t), 0.95), min(exp(t) - 1, 20))``. When no suffix gets under tau
    (every token of T alone exceeds it) t = 0: all of T is clipped.

    Pass tensors of any shape; for micro-batched training, concatenate every
    micro-batch's flattened tensors so the bound is the batch's, not a micro-batch's.
    """
    trained = mask.bool()
    advantages = advantages.expand_as(logp)
    log_ratio = (logp - old_logp).double()
    moves = trained & (((advantages > 0) & (log_ratio > 0)) | ((advantages < 0) & (log_ratio < 0)))
    m2 = log_ratio[moves].square()
    if m2.numel() == 0 or float(m2.mean()) <= tau:
        return None
    ordered = m2.sort(descending=True).values
    suffix_sums = ordered.flip(0).cumsum(0).flip(0)
    suffix_means = suffix_sums / torch.arange(len(ordered), 0, -1, dtype=ordered.dtype)
    under = torch.nonzero(suffix_means < tau)
    t = math.sqrt(float(ordered[under[0, 0]])) if len(under) else 0.0
    return min(1.0 - math.exp(-t), _M2PO_MAX_EPS_LOW), min(math.exp(t) - 1.0, _M2PO_MAX_EPS_HIGH)
