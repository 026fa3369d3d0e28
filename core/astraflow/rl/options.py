"""Optimisation settings every policy-gradient trainer backend shares (torch-free).

Backends extend this dataclass with their own fields, so the same override
(``trainer.lr=3e-4``) means the same thing whichever backend is selected.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from astraflow.schema import setting

#: ``target_modules`` shorthand for every linear layer but the output head (peft's)
ALL_LINEAR = "all-linear"
#: names of the trained and exported dtypes, of the losses and of the rollout corrections
DTYPE_NAMES = ("bfloat16", "float32")
LOSSES = ("ppo", "m2po")
CORRECTIONS = ("none", "tis", "mis")
LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class LoraOptions:
    """``trainer.lora``: train low-rank adapters instead of the whole model.

    ``rank`` 0 trains every weight; above 0 every module named by ``target_modules`` (a
    list of module names, each matching a module whose name ends with it, or
    ``all-linear``) gets a rank-``rank`` adapter scaled by ``alpha / rank``, and only
    the adapters are trained, kept in the optimiser and published. ``lr_ratio`` is
    LoRA+'s ratio of the learning rate of each adapter's ``B`` matrix to that of its
    ``A`` (which is ``trainer.lr``): 1 is plain LoRA; B starts at zero and its larger
    steps make adapters learn faster at the same stability (Hayou et al., 2024, suggest
    16). ``merge_final`` also writes the merged model next to the final adapter.
    """

    rank: int = setting(0, ge=0, why="0: no adapters")
    alpha: float = setting(32.0, gt=0)
    dropout: float = setting(0.0, ge=0, lt=1)
    target_modules: Any = ALL_LINEAR
    lr_ratio: float = setting(1.0, gt=0, why="1: plain LoRA")
    merge_final: bool = False


def lora_targets(lora: Any) -> list[str] | str:
    """``target_modules`` checked: ``all-linear``, or a non-empty list of names."""
    targets = lora.target_modules
    if isinstance(targets, str):
        targets = targets if targets == ALL_LINEAR else [targets]
    else:
        targets = list(targets or [])
        if not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(f"trainer.lora.target_modules={targets!r}: give module names "
                             f"(e.g. [q_proj, v_proj]) or {ALL_LINEAR!r}")
    return targets


def check_lora(lora: Any) -> None:
    """What the declared ranges of :class:`LoraOptions` cannot say: the target modules of
    adapters that are trained (``rank`` > 0)."""
    if lora.rank > 0:
        lora_targets(lora)


def lora_rank(trainer: Any) -> int:
    """The adapter rank of a trainer config (0: full-weight training); any config works."""
    lora = trainer.get("lora") if hasattr(trainer, "get") else getattr(trainer, "lora", None)
    if lora is None:
        return 0
    return int(lora.get("rank", 0) if hasattr(lora, "get") else lora.rank)


@dataclass
class PolicyGradientOptions:
    """``dtype`` is the dtype of the trained (master) weights: float32 keeps small AdamW
    updates that bfloat16 would round away. ``export_dtype`` is what rollout engines
    load. ``loss`` is ``ppo`` (PPO-clip / GRPO with ``eps_low``/``eps_high``) or
    ``m2po`` (bounds from the batch's second moment, ``m2po_tau``: known only once every
    micro-batch's log-probs are, so a batch of several micro-batches costs a no-grad pass
    first, one that fits ``micro_batch_size`` does not). ``kl_coef > 0`` keeps
    a frozen copy of the initial model as the KL reference.

    A micro-batch holds at most ``micro_batch_size`` sequences and, with
    ``micro_batch_tokens`` > 0, at most that many padded tokens (its sequences x the
    longest of them): short sequences pack many to a micro-batch, long ones few, so the
    activations a micro-batch holds stay bounded whatever the lengths (a sequence longer
    than the budget goes alone). Packing keeps a group's samples together where the
    bounds allow, so a shared prompt is computed once. ``num_threads`` sets
    torch's intra-op threads (0 leaves torch's default).

    ``world_size`` is how many processes (ranks, one device each) train this policy
    together: ``tensor_model_parallel_size`` x ``pipeline_model_parallel_size`` x
    ``data_parallel_size`` (0: whatever is left of the world size). Above 1 the
    trainer runs under ``torchrun``; every collective gives up after
    ``collective_timeout`` seconds, so a dead rank ends the trainer instead of hanging it.

    ``lora`` trains low-rank adapters (:class:`LoraOptions`); its ``rank`` 0 (the
    default) trains the whole model.

    ``lr_schedule`` is ``constant``, ``linear`` or ``cosine``: after ``warmup_steps`` of
    linear warm-up the rate decays from ``lr`` to ``min_lr_ratio * lr`` at
    ``total_steps`` (0: the run's ``steps``, filled in by the runtime).

    ``rollout_correction`` bounds the importance weight pi_trainer / pi_engine of each
    token (the rollout engine's log-probs come from other kernels and precision, maybe
    older weights): ``none``; ``tis`` truncates weights above ``rollout_correction_cap``
    to the cap (truncated IS); ``mis`` drops tokens whose weight is above it from the
    loss (masked IS). PPO/M2PO clipping applies as without one (see
    :func:`astraflow.rl.losses.policy_loss`). Whatever the mode, the train metrics
    report the engine-vs-trainer log-prob gap and the fraction of tokens beyond the cap.

    Every step also reports how off-policy its batch is, a gauge that means the same at
    any batch size or staleness bound: ``ess_fraction``, the effective sample size of the
    sequences' importance weights (behaviour -> the trainer's weights at the step's
    start; each sequence's weight is the product of its trained tokens' ratios) over the
    sequences, 1.0 on-policy; and ``offpolicy_kl``, the token mean of the k3 estimate of
    KL(behaviour || trainer). ``ess_lr_power`` > 0 scales the step's learning rate by
    ``min(1, ess_fraction) ** ess_lr_power`` (VCPO's ESS-guided step, 0.5 for AdamW):
    a batch that a few sequences dominate moves the weights less.
    """

    name: str = ""
    lr: float = setting(3e-4, gt=0)
    weight_decay: float = setting(0.0, ge=0)
    beta1: float = setting(0.9, ge=0, lt=1)
    beta2: float = setting(0.999, ge=0, lt=1)
    adam_eps: float = setting(1e-8, gt=0)
    micro_batch_size: int = setting(64, ge=1)
    micro_batch_tokens: int = setting(0, ge=0, why="0: micro_batch_size sequences a "
                                      "micro-batch, however long")
    dtype: str = setting("float32", choices=DTYPE_NAMES)
    export_dtype: str = setting("bfloat16", choices=DTYPE_NAMES)
    loss: str = setting("ppo", choices=LOSSES)
    eps_low: float = setting(0.2, ge=0, le=1)  # the ratio is clipped at 1 - eps_low
    eps_high: float = setting(0.28, ge=0)
    m2po_tau: float = setting(0.01, gt=0)
    kl_coef: float = setting(0.0, ge=0, why="0: no KL reference")
    rollout_correction: str = setting("none", choices=CORRECTIONS)
    rollout_correction_cap: float = setting(2.0, gt=1)
    max_grad_norm: float = setting(1.0, ge=0, why="0: no clipping")
    num_threads: int = setting(0, ge=0, why="0: torch's default")
    lr_schedule: str = setting("cosine", choices=LR_SCHEDULES)
    warmup_steps: int = setting(0, ge=0)
    min_lr_ratio: float = setting(0.1, ge=0, le=1)
    total_steps: int = setting(0, ge=0, why="0: the run's steps")
    world_size: int = setting(1, ge=1)
    tensor_model_parallel_size: int = setting(1, ge=1)
    pipeline_model_parallel_size: int = setting(1, ge=1)
    data_parallel_size: int = setting(0, ge=0, why="0: whatever is left of the world size")
    collective_timeout: float = setting(600.0, gt=0)
    lora: LoraOptions = field(default_factory=LoraOptions)
    ess_lr_power: float = setting(0.0, ge=0, why="0: the schedule's rate as is; VCPO: 0.5")

    @staticmethod
    def relations(trainer: Any) -> list[str]:
        """A layout of ranks that cannot be: ``world_size`` is tensor x pipeline x data
        parallel ranks."""
        try:
            parallel_sizes(trainer)
        except ValueError as exc:
            return [str(exc)]
        return []


def lr_at(options: PolicyGradientOptions, step: int) -> float:
    """The learning rate of optimiser step ``step`` (0-based) under ``options``' schedule."""
    if options.lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"trainer.lr_schedule={options.lr_schedule!r}: choose one of "
                         f"{list(LR_SCHEDULES)}")
    if step < options.warmup_steps:
        return options.lr * (step + 1) / options.warmup_steps
    if options.lr_schedule == "constant" or options.total_steps <= options.warmup_steps:
        return options.lr
    progress = min(1.0, (step - options.warmup_steps)
                   / (options.total_steps - options.warmup_steps))
    if options.lr_schedule == "linear":
        scale = 1.0 - progress
    else:
        scale = 0.5 * (1.0 + math.cos(math.pi * progress))
    return options.lr * (options.min_lr_ratio + (1.0 - options.min_lr_ratio) * scale)


def parallel_sizes(options: object) -> tuple[int, int, int]:
    """``(data, tensor, pipeline)`` parallel sizes of a trainer config, checked.

    Any trainer config works: one without these settings is a single process.
    """
    get: Callable[[str, Any], Any] = (getattr(options, "get", None)
                                      or (lambda k, d: getattr(options, k, d)))
    world = int(get("world_size", 1))
    tp = int(get("tensor_model_parallel_size", 1))
    pp = int(get("pipeline_model_parallel_size", 1))
    dp = int(get("data_parallel_size", 0))
    if world % (tp * pp):
        raise ValueError(f"trainer.world_size={world} is not a multiple of "
                         f"tensor_model_parallel_size x pipeline_model_parallel_size = {tp * pp}")
    if dp == 0:
        dp = world // (tp * pp)
    if dp * tp * pp != world:
        raise ValueError(f"trainer.data_parallel_size={dp} x tensor_model_parallel_size={tp} x "
                         f"pipeline_model_parallel_size={pp} != world_size={world}")
    return dp, tp, pp


def check_policy_gradient(config: Any) -> None:
    """Every policy-gradient backend's settings judged without importing torch, so the
    launcher's pre-flight costs no engine import (``PolicyGradientBackend`` runs it too).
    Ranges and choices are declared with the settings and checked as the config is
    composed; here is what they cannot say."""
    parallel_sizes(config)
    if getattr(config, "lora", None) is not None:
        check_lora(config.lora)
