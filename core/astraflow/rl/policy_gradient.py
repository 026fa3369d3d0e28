"""The train step every policy-gradient trainer backend shares (imports torch).

A backend supplies its model, optimiser and how to get logits; this base supplies
micro-batching, the loss (PPO-clip / GRPO or M2PO, optional KL), gradient
accumulation normalised by the whole batch's trained tokens, clipping and metrics. So
``trainer=hf`` and ``trainer=megatron`` optimise exactly the same objective.

Sequences are right-padded, so causal attention never lets a real token see padding.
Each item's advantage is broadcast over its trained tokens (``loss_mask``);
``Trajectory.logprobs`` are the behaviour log-probs of the importance ratio.

With data parallelism (``dp_size`` > 1) every rank is given the whole batch and trains
on its share (items ``dp_rank``, ``dp_rank + dp_size``, ...). The loss is still
normalised by the trained tokens of the whole batch and the gradients are summed over
the replicas, so a step equals the single-process step on the same batch; metrics are
summed over the replicas too, and M2PO's bounds are the whole batch's. Every replica
runs the same number of micro-batches (an empty one if its share is short), so the
collectives of a sharded model always meet.

A pipeline-parallel subclass returns no logits (``None``) from ``logits`` on every stage
but the last: there the forward pass only hands its activations on, ``backward(None)``
waits for their gradient from the next stage, and ``_from_last_stage`` brings the
metrics and log-probs computed by the last stage back to every stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from astraflow.contracts import TrainerBackend
from astraflow.rl.losses import m2po_clip, policy_loss, token_entropy, token_logprobs
from astraflow.rl.options import check_lora, lr_at, parallel_sizes
from astraflow.types import Batch, TrainItem

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
LOSSES = ("ppo", "m2po")


def dtype_of(name: str, field: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"trainer.{field}={name!r}: choose one of {sorted(DTYPES)}")
    return DTYPES[name]


@dataclass
class MicroBatch:
    tokens: torch.Tensor  # [b, T] right-padded ids
    mask: torch.Tensor  # [b, T] 1.0 on trained tokens
    old_logp: torch.Tensor  # [b, T] behaviour log-probs
    advantages: torch.Tensor  # [b, 1]
    lengths: list[int]


def micro_batches(items: list[TrainItem], size: int, pad_token_id: int,
                  device: torch.device | str | None = None) -> list[MicroBatch]:
    out = []
    for start in range(0, len(items), size):
        chunk = items[start : start + size]
        for item in chunk:
            item.trajectory.validate()
        width = max(len(item.trajectory.tokens) for item in chunk)

        def padded(values: list[Any], fill: float, width: int = width) -> list[Any]:
            return list(values) + [fill] * (width - len(values))

        trajs = [item.trajectory for item in chunk]
        out.append(MicroBatch(
            tokens=torch.tensor([padded(t.tokens, pad_token_id) for t in trajs], device=device),
            mask=torch.tensor([padded(t.loss_mask, 0) for t in trajs], dtype=torch.float,
                              device=device),
            old_logp=torch.tensor([padded(t.logprobs, 0.0) for t in trajs], device=device),
            advantages=torch.tensor([[item.advantage] for item in chunk], device=device),
            lengths=[len(t.tokens) for t in trajs],
        ))
    return out


class PolicyGradientBackend(TrainerBackend):
    """``train_step`` and ``compute_logprobs`` over whatever model a subclass builds.

    Subclasses set ``model``, ``reference`` (or None), ``optimizer``, ``pad_token_id``
    and ``device``, and implement ``logits``; they may override ``backward`` and
    ``clip_grad_norm`` (e.g. to run inside an engine's device context or to sum norms
    across tensor-parallel shards). A data-parallel subclass sets ``dp_rank``,
    ``dp_size`` and ``dp_group`` and makes the gradients summed over the replicas by
    the end of ``reduce_gradients``.
    """

    model: Any
    reference: Any = None
    optimizer: torch.optim.Optimizer
    pad_token_id: int = 0
    device: torch.device | str | None = None
    step: int = 0
    dp_rank: int = 0
    dp_size: int = 1
    dp_group: Any = None

    @classmethod
    def check_config(cls, config: Any) -> None:
        dtype_of(config.dtype, "dtype")
        dtype_of(config.export_dtype, "export_dtype")
        if config.loss not in LOSSES:
            raise ValueError(f"trainer.loss={config.loss!r}: choose one of {list(LOSSES)}")
        if config.micro_batch_size < 1:
            raise ValueError(f"trainer.micro_batch_size={config.micro_batch_size} must be >= 1")
        if not 0.0 <= config.min_lr_ratio <= 1.0:
            raise ValueError(f"trainer.min_lr_ratio={config.min_lr_ratio} must lie in [0, 1]")
        lr_at(config, 0)  # an unknown schedule is refused here, not at the first step
        parallel_sizes(config)
        if getattr(config, "lora", None) is not None:
            check_lora(config.lora)

    def logits(self, model: Any, tokens: torch.Tensor) -> torch.Tensor:
        """``[b, T, V]`` logits of ``model`` for right-padded ``tokens``."""
        raise NotImplementedError

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_grad_norm(self, max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def reduce_gradients(self) -> None:
        """Make every replica's gradients the sum over replicas (after the last backward)."""

    def _from_last_stage(self, values: list[float]) -> list[float]:
        """What the last pipeline stage computed, on every stage (no pipeline: as is)."""
        return values

    def _micro_batches(self, items: list[TrainItem]) -> list[MicroBatch]:
        return micro_batches(items, self.config.micro_batch_size, self.pad_token_id,
                             self.device)

    def _share(self, items: list[TrainItem]) -> list[MicroBatch]:
        """This replica's micro-batches: as many on every replica, padded with empty ones."""
        if self.dp_size == 1:
            return self._micro_batches(items)
        size = self.config.micro_batch_size
        count = math.ceil(math.ceil(len(items) / self.dp_size) / size)
        micros = self._micro_batches(items[self.dp_rank :: self.dp_size])
        empty = torch.tensor([[self.pad_token_id]], device=self.device)
        zeros = torch.zeros(1, 1, device=self.device)
        micros += [MicroBatch(empty, zeros, zeros, zeros, [1])] * (count - len(micros))
        return micros

    def _sum(self, values: list[float]) -> list[float]:
        """``values`` summed over the data-parallel replicas."""
        if self.dp_size == 1:
            return values
        total = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(total, group=self.dp_group)
        return total.tolist()

    def train_step(self, batch: Batch) -> dict[str, float]:
        cfg = self.config
        micros = self._share(batch.items)
        (num_tokens,) = self._sum([float(sum(float(m.mask.sum()) for m in micros))])
        if num_tokens == 0:
            raise ValueError(f"batch {batch.batch_id!r} has no trained tokens (all loss_mask 0)")
        clip = self._clip(micros)
        self.optimizer.zero_grad(set_to_none=True)
        totals = dict.fromkeys(("loss", "clipped", "ratio", "kl", "entropy", "logp_diff"), 0.0)
        for micro in micros:
            logits = self.logits(self.model, micro.tokens)
            ref_logits = None
            if self.reference is not None:
                with torch.no_grad():
                    ref_logits = self.logits(self.reference, micro.tokens)
            if logits is None:  # an earlier pipeline stage: the loss is the last stage's
                self.backward(None)
                continue
            logp = token_logprobs(logits, micro.tokens)
            ref_logp = None if ref_logits is None else token_logprobs(ref_logits, micro.tokens)
            out = policy_loss(logp, micro.old_logp, micro.advantages, micro.mask, clip=clip,
                              ref_logp=ref_logp, kl_coef=cfg.kl_coef, num_tokens=num_tokens)
            self.backward(out.loss)
            totals["loss"] += float(out.loss.detach())
            totals["clipped"] += float(out.clipped_tokens)
            totals["ratio"] += float(out.ratio_sum)
            totals["kl"] += float(out.kl_sum)
            totals["entropy"] += float((token_entropy(logits) * micro.mask).sum())
            diff = (logp.detach() - micro.old_logp).abs() * micro.mask
            totals["logp_diff"] += float(diff.sum())
        self.reduce_gradients()
        totals = dict(zip(totals, self._from_last_stage(self._sum(list(totals.values()))),
                          strict=True))
        grad_norm = self.clip_grad_norm(cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
        lr = lr_at(cfg, self.step)
        for group in self.optimizer.param_groups:  # LoRA+ gives the B matrices a multiple
            group["lr"] = lr * group.get("lr_scale", 1.0)
        self.optimizer.step()
        self.step += 1
        metrics = {
            "loss": totals["loss"],
            "grad_norm": grad_norm,
            "lr": lr,
            "clip_fraction": totals["clipped"] / num_tokens,
            "ratio_mean": totals["ratio"] / num_tokens,
            "entropy": totals["entropy"] / num_tokens,
            "logprob_abs_diff": totals["logp_diff"] / num_tokens,
            "tokens": num_tokens,
            "sequences": float(len(batch.items)),
            "step": float(self.step),
        }
        if self.reference is not None:
            metrics["kl"] = totals["kl"] / num_tokens
        if cfg.loss == "m2po":
            metrics["m2po_clip_active"] = float(clip is not None)
            if clip is not None:
                metrics["m2po_eps_low"], metrics["m2po_eps_high"] = clip
        return metrics

    def _clip(self, micros: list[MicroBatch]) -> tuple[float, float] | None:
        """PPO's fixed bounds, or M2PO's from a no-grad pass over the whole batch."""
        if self.config.loss == "ppo":
            return (self.config.eps_low, self.config.eps_high)
        logps, olds, advs, masks = [], [], [], []
        with torch.no_grad():
            for micro in micros:
                logits = self.logits(self.model, micro.tokens)
                if logits is None:  # an earlier pipeline stage: the clip is the last's
                    continue
                logp = token_logprobs(logits, micro.tokens)
                logps.append(logp.flatten())
                olds.append(micro.old_logp.flatten())
                advs.append(micro.advantages.expand_as(logp).flatten())
                masks.append(micro.mask.flatten())
        clip = None
        if logps:
            tensors = [torch.cat(t) for t in (logps, olds, advs, masks)]
            if self.dp_size > 1:  # the bounds are the whole batch's: gather its tokens
                trained = tensors[3].bool()
                tensors = [self._gather(t[trained].double()) for t in tensors]
            clip = m2po_clip(*tensors, tau=self.config.m2po_tau)
        active, low, high = self._from_last_stage([1.0, *clip] if clip else [0.0, 0.0, 0.0])
        return (low, high) if active else None

    def _gather(self, values: torch.Tensor) -> torch.Tensor:
        """A 1-D tensor of any length per replica, concatenated in replica order."""
        sizes = [torch.zeros(1, dtype=torch.int64, device=self.device)
                 for _ in range(self.dp_size)]
        dist.all_gather(sizes, torch.tensor([values.numel()], device=self.device),
                        group=self.dp_group)
        width = max(int(n) for n in sizes)
        padded = torch.zeros(width, dtype=values.dtype, device=self.device)
        padded[: values.numel()] = values
        parts = [torch.empty_like(padded) for _ in range(self.dp_size)]
        dist.all_gather(parts, padded, group=self.dp_group)
        return torch.cat([part[: int(n)] for part, n in zip(parts, sizes, strict=True)])

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch) -> list[list[float]]:
        out: list[list[float]] = []
        lengths = []
        for micro in self._micro_batches(batch.items):
            lengths += micro.lengths
            logits = self.logits(self.model, micro.tokens)
            if logits is None:  # an earlier pipeline stage
                continue
            logp = token_logprobs(logits, micro.tokens)
            out += [row[:n] for row, n in zip(logp.tolist(), micro.lengths, strict=True)]
        flat = self._from_last_stage([x for row in out for x in row]
                                     if out else [0.0] * sum(lengths))
        rows, start = [], 0
        for n in lengths:
            rows.append(flat[start : start + n])
            start += n
        return rows
