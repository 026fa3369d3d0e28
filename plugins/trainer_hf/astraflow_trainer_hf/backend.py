"""``trainer=hf``: one policy's Hugging Face causal LM and its AdamW optimiser.

Sequences are right-padded, so causal attention never lets a real token see padding
and no attention mask is needed. Each item's advantage is broadcast over its trained
tokens (``loss_mask``); ``Trajectory.logprobs`` are the behaviour log-probs of the
importance ratio. Gradients are accumulated over micro-batches with the loss
normalised by the trained tokens of the whole batch, so the update does not depend on
``micro_batch_size``.

Checkpoints hold tensors in safetensors and everything else in JSON: nothing is
pickled, so a checkpoint can be loaded from an untrusted directory.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from astraflow.contracts import TrainerBackend
from astraflow.rl.losses import m2po_clip, policy_loss, token_entropy, token_logprobs
from astraflow.types import Batch, TrainItem

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_LOSSES = ("ppo", "m2po")
_MODEL_FILE = "model.safetensors"
_OPTIMIZER_FILE = "optimizer.safetensors"
_STATE_FILE = "trainer_state.json"
_FORMAT = 1


@dataclass
class _MicroBatch:
    tokens: torch.Tensor  # [b, T] right-padded ids
    mask: torch.Tensor  # [b, T] 1.0 on trained tokens
    old_logp: torch.Tensor  # [b, T] behaviour log-probs
    advantages: torch.Tensor  # [b, 1]
    lengths: list[int]


def _dtype(name: str, field: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"trainer.{field}={name!r}: choose one of {sorted(_DTYPES)}")
    return _DTYPES[name]


def _load_model(path: str, dtype: torch.dtype) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)


class HFTrainerBackend(TrainerBackend):
    """PPO-clip / GRPO or M2PO over a ``transformers`` causal LM, on CPU or one device."""

    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)
        if config.loss not in _LOSSES:
            raise ValueError(f"trainer.loss={config.loss!r}: choose one of {list(_LOSSES)}")
        if config.micro_batch_size < 1:
            raise ValueError(f"trainer.micro_batch_size={config.micro_batch_size} must be >= 1")
        self.dtype = _dtype(config.dtype, "dtype")
        self.export_dtype = _dtype(config.export_dtype, "export_dtype")
        if config.num_threads > 0:
            torch.set_num_threads(config.num_threads)
        self.model = _load_model(model_path, self.dtype).train()
        self.reference = None
        if config.kl_coef:
            self.reference = _load_model(model_path, self.dtype).eval().requires_grad_(False)
        pad = self.model.config.pad_token_id
        self.pad_token_id: int = 0 if pad is None else int(pad)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=(config.beta1, config.beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.step = 0

    # -- batches -----------------------------------------------------------------

    def _micro_batches(self, items: list[TrainItem]) -> list[_MicroBatch]:
        size = self.config.micro_batch_size
        out = []
        for start in range(0, len(items), size):
            chunk = items[start : start + size]
            for item in chunk:
                item.trajectory.validate()
            width = max(len(item.trajectory.tokens) for item in chunk)

            def padded(values: list[Any], fill: float, width: int = width) -> list[Any]:
                return list(values) + [fill] * (width - len(values))

            trajs = [item.trajectory for item in chunk]
            out.append(
                _MicroBatch(
                    tokens=torch.tensor([padded(t.tokens, self.pad_token_id) for t in trajs]),
                    mask=torch.tensor([padded(t.loss_mask, 0) for t in trajs], dtype=torch.float),
                    old_logp=torch.tensor([padded(t.logprobs, 0.0) for t in trajs]),
                    advantages=torch.tensor([[item.advantage] for item in chunk]),
                    lengths=[len(t.tokens) for t in trajs],
                )
            )
        return out

    def _forward(self, model: torch.nn.Module, micro: _MicroBatch) -> torch.Tensor:
        return model(input_ids=micro.tokens, use_cache=False).logits

    # -- the contract --------------------------------------------------------------

    def train_step(self, batch: Batch) -> dict[str, float]:
        cfg = self.config
        micros = self._micro_batches(batch.items)
        num_tokens = float(sum(float(m.mask.sum()) for m in micros))
        if num_tokens == 0:
            raise ValueError(f"batch {batch.batch_id!r} has no trained tokens (all loss_mask 0)")
        clip = self._clip(micros)
        self.optimizer.zero_grad(set_to_none=True)
        totals = dict.fromkeys(("loss", "clipped", "ratio", "kl", "entropy", "logp_diff"), 0.0)
        for micro in micros:
            logits = self._forward(self.model, micro)
            logp = token_logprobs(logits, micro.tokens)
            ref_logp = None
            if self.reference is not None:
                with torch.no_grad():
                    ref_logp = token_logprobs(self._forward(self.reference, micro), micro.tokens)
            out = policy_loss(
                logp,
                micro.old_logp,
                micro.advantages,
                micro.mask,
                clip=clip,
                ref_logp=ref_logp,
                kl_coef=cfg.kl_coef,
                num_tokens=num_tokens,
            )
            out.loss.backward()
            totals["loss"] += float(out.loss.detach())
            totals["clipped"] += float(out.clipped_tokens)
            totals["ratio"] += float(out.ratio_sum)
            totals["kl"] += float(out.kl_sum)
            totals["entropy"] += float((token_entropy(logits) * micro.mask).sum())
            diff = (logp.detach() - micro.old_logp).abs() * micro.mask
            totals["logp_diff"] += float(diff.sum())
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        self.step += 1
        metrics = {
            "loss": totals["loss"],
            "grad_norm": float(grad_norm),
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

    def _clip(self, micros: list[_MicroBatch]) -> tuple[float, float] | None:
        """PPO's fixed bounds, or M2PO's from a no-grad pass over the whole batch."""
        if self.config.loss == "ppo":
            return (self.config.eps_low, self.config.eps_high)
        logps, olds, advs, masks = [], [], [], []
        with torch.no_grad():
            for micro in micros:
                logp = token_logprobs(self._forward(self.model, micro), micro.tokens)
                logps.append(logp.flatten())
                olds.append(micro.old_logp.flatten())
                advs.append(micro.advantages.expand_as(logp).flatten())
                masks.append(micro.mask.flatten())
        return m2po_clip(
            torch.cat(logps),
            torch.cat(olds),
            torch.cat(advs),
            torch.cat(masks),
            tau=self.config.m2po_tau,
        )

    @torch.no_grad()
    def compute_logprobs(self, batch: Batch) -> list[list[float]]:
        out: list[list[float]] = []
        for micro in self._micro_batches(batch.items):
            logp = token_logprobs(self._forward(self.model, micro), micro.tokens)
            out += [row[:n] for row, n in zip(logp.tolist(), micro.lengths, strict=True)]
        return out

    def export_weights(self) -> dict[str, torch.Tensor]:
        """A snapshot (copies) in ``export_dtype``: later steps never change it."""
        return {
            name: tensor.detach().to(self.export_dtype, copy=True)
            for name, tensor in self.model.state_dict().items()
        }

    # -- persistence ---------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        """Model and AdamW moments as safetensors; step and hyperparameters as JSON.

        ``trainer_state.json`` is written last, so its presence marks a whole checkpoint.
        """
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.detach().contiguous() for k, v in self.model.state_dict().items()},
            str(out / _MODEL_FILE),
        )
        names = {id(p): name for name, p in self.model.named_parameters()}
        moments = {}
        for param, state in self.optimizer.state.items():
            for key, value in state.items():
                moments[f"{names[id(param)]}::{key}"] = value.detach().contiguous()
        save_file(moments, str(out / _OPTIMIZER_FILE))
        groups = [
            {k: v for k, v in group.items() if k != "params"}
            for group in self.optimizer.state_dict()["param_groups"]
        ]
        state = {
            "format": _FORMAT,
            "step": self.step,
            "dtype": self.config.dtype,
            "param_groups": groups,
        }
        (out / _STATE_FILE).write_text(json.dumps(state, indent=2))

    def load_checkpoint(self, path: str) -> None:
        src = Path(path)
        state_path = src / _STATE_FILE
        if not state_path.exists():
            raise FileNotFoundError(f"{src} holds no complete checkpoint ({_STATE_FILE} missing)")
        state = json.loads(state_path.read_text())
        if state.get("format") != _FORMAT:
            raise ValueError(f"{src}: checkpoint format {state.get('format')}, expected {_FORMAT}")
        if state["dtype"] != self.config.dtype:
            raise ValueError(
                f"{src} was trained in {state['dtype']}, this trainer uses {self.config.dtype}"
            )
        self.model.load_state_dict(load_file(str(src / _MODEL_FILE)), strict=True)
        moments = load_file(str(src / _OPTIMIZER_FILE))
        index = {name: i for i, (name, _) in enumerate(self.model.named_parameters())}
        per_param: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in moments.items():
            name, _, slot = key.rpartition("::")
            per_param.setdefault(index[name], {})[slot] = value
        current = self.optimizer.state_dict()["param_groups"]
        groups = [
            {**saved, "params": group["params"]}
            for saved, group in zip(state["param_groups"], current, strict=True)
        ]
        self.optimizer.load_state_dict({"state": per_param, "param_groups": groups})
        self.step = int(state["step"])

    def save_pretrained(self, path: str) -> None:
        """The model in its training dtype, plus the tokenizer it was loaded with."""
        self.model.save_pretrained(path)
        if (Path(self.model_path) / "tokenizer_config.json").exists():
            AutoTokenizer.from_pretrained(self.model_path, local_files_only=True).save_pretrained(
                path
            )
