"""The engine's training math: Tinker's built-in losses and the AdamW update.

A loss is a per-token term whose sum over tokens and datums is the loss.
Each takes the learner's logprobs ``lp`` of the target tokens (a ``[batch, time]`` tensor
that carries the gradient), the datums' other ``loss_fn_inputs`` padded to the same shape,
and the loss's config; ``q`` is the sampler's ``logprobs``, ``A`` the ``advantages`` and
``r = exp(lp - q)`` the importance ratio.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

Inputs = dict[str, torch.Tensor]


class EngineError(ValueError):
    """A request the engine refuses (bad shapes, unknown loss, unknown tenant): the
    client's error. The message says what and where."""


@dataclass(frozen=True)
class Loss:
    """A loss: the ``loss_fn_inputs`` it reads besides ``target_tokens``, the config keys
    it accepts with their defaults (``None``: required), and its per-token term."""

    inputs: tuple[str, ...]
    config: dict[str, float | None]
    per_token: Callable[[torch.Tensor, Inputs, dict[str, float]], torch.Tensor]


def _ratio(lp: torch.Tensor, x: Inputs) -> torch.Tensor:
    return torch.exp(lp - x["logprobs"])


def _cross_entropy(lp: torch.Tensor, x: Inputs, c: dict[str, float]) -> torch.Tensor:
    return -(lp * x["weights"])


def _importance_sampling(lp: torch.Tensor, x: Inputs, c: dict[str, float]) -> torch.Tensor:
    return -(_ratio(lp, x) * x["advantages"])


def _ppo(lp: torch.Tensor, x: Inputs, c: dict[str, float]) -> torch.Tensor:
    r, a = _ratio(lp, x), x["advantages"]
    clipped = r.clamp(c["clip_low_threshold"], c["clip_high_threshold"])
    return -torch.minimum(r * a, clipped * a)


def _cispo(lp: torch.Tensor, x: Inputs, c: dict[str, float]) -> torch.Tensor:
    weight = _ratio(lp, x).clamp(c["clip_low_threshold"], c["clip_high_threshold"]).detach()
    return -(weight * lp * x["advantages"])


def _dro(lp: torch.Tensor, x: Inputs, c: dict[str, float]) -> torch.Tensor:
    return -(lp * x["advantages"] - 0.5 * c["beta"] * (lp - x["logprobs"]) ** 2)


_RL = ("logprobs", "advantages")

LOSSES: dict[str, Loss] = {
    "cross_entropy": Loss(("weights",), {}, _cross_entropy),
    "importance_sampling": Loss(_RL, {}, _importance_sampling),
    "ppo": Loss(_RL, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, _ppo),
    "cispo": Loss(_RL, {"clip_low_threshold": 0.0, "clip_high_threshold": 4.0}, _cispo),
    "dro": Loss(_RL, {"beta": None}, _dro),
}


def resolve(name: str, config: dict[str, float]) -> tuple[Loss, dict[str, float]]:
    """The loss ``name`` and its settings: ``config`` over the defaults."""
    if name not in LOSSES:
        raise EngineError(f"loss_fn={name!r} is not one of {', '.join(LOSSES)}")
    loss = LOSSES[name]
    unknown = sorted(set(config) - set(loss.config))
    if unknown:
        raise EngineError(f"loss_fn_config {unknown} is not read by {name!r}, which takes "
                          f"{sorted(loss.config) or 'none'}")
    settings = {}
    for key, default in loss.config.items():
        value = config.get(key, default)
        if value is None:
            raise EngineError(f"loss_fn_config: {name!r} needs {key!r}")
        settings[key] = float(value)
    return loss, settings


def gather_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits)[target]`` without a second vocabulary-wide tensor."""
    picked = logits.gather(-1, targets.to(logits.device)[..., None]).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


@torch.no_grad()
def adamw(params: list[torch.Tensor], exp_avg: list[torch.Tensor],
          exp_avg_sq: list[torch.Tensor], step: int, learning_rate: float, beta1: float,
          beta2: float, eps: float, weight_decay: float, grad_clip_norm: float) -> float:
    """AdamW's update number ``step`` (from 1) in place from the gradients ``params``
    hold, as ``torch.optim.AdamW`` makes it (decoupled weight decay, bias correction),
    after clipping their global norm to ``grad_clip_norm`` if that is positive. Clears
    the gradients; returns their norm before clipping."""
    hyper = {"learning_rate": learning_rate, "beta1": beta1, "beta2": beta2, "eps": eps,
             "weight_decay": weight_decay, "grad_clip_norm": grad_clip_norm}
    if (not all(math.isfinite(v) for v in hyper.values()) or learning_rate < 0
            or not 0 <= beta1 < 1 or not 0 <= beta2 < 1 or eps <= 0 or weight_decay < 0
            or grad_clip_norm < 0):
        raise EngineError(f"adam_params out of range: {hyper}")
    grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in params]
    norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
    scale = 1.0
    if 0 < grad_clip_norm < norm:
        scale = grad_clip_norm / (norm + 1e-6)
    step_size = learning_rate / (1 - beta1**step)
    root_bc2 = math.sqrt(1 - beta2**step)
    for p, g, m, v in zip(params, grads, exp_avg, exp_avg_sq, strict=True):
        g = g * scale
        p.mul_(1 - learning_rate * weight_decay)
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        p.addcdiv_(m, (v.sqrt() / root_bc2).add_(eps), value=-step_size)
        p.grad = None
    return norm
