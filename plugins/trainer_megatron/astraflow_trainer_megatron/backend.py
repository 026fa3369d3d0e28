"""``trainer=megatron``: one policy as a Megatron-core ``GPTModel`` and its AdamW optimiser.

The model is built from a Hugging Face Llama/Qwen checkpoint (:mod:`.convert`) and
exported by Hugging Face names, so rollout engines never see Megatron's layout.
Batches are handled exactly as by ``trainer=hf``: right-padded sequences under a
causal mask, each item's advantage broadcast over its trained tokens, gradients
accumulated over micro-batches with the loss normalised by the trained tokens of the
whole batch, and the losses of :mod:`astraflow.rl.losses`.

The optimiser is ``torch.optim.AdamW`` over the bare model: Megatron's distributed
optimiser and its DDP wrapper need CUDA, and a single model replica has no gradients
to reduce. With tensor parallelism every rank must be given the same batch; exports
and ``save_pretrained`` gather the full tensors on every rank.

Checkpoints hold tensors in safetensors (Megatron names, one file per tensor-parallel
rank) and everything else in JSON: nothing is pickled.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from astraflow.contracts import TrainerBackend
from astraflow.rl.losses import m2po_clip, policy_loss, token_entropy, token_logprobs
from astraflow.types import Batch, TrainItem

with warnings.catch_warnings():
    # Transformer Engine and Apex are optional accelerators: Megatron falls back to torch
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from astraflow_trainer_megatron import convert, parallel

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_LOSSES = ("ppo", "m2po")
_STATE_FILE = "trainer_state.json"
_FORMAT = 1
#: files of a Hugging Face checkpoint that describe the model without its weights
_HF_SIDE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


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


def _build_model(
    arch: convert.Architecture, vocab_rows: int, dtype: torch.dtype, device: torch.device
) -> Any:
    """An uninitialised ``GPTModel`` shaped like ``arch`` (weights are loaded after)."""
    config = TransformerConfig(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        ffn_hidden_size=arch.ffn_hidden_size,
        num_attention_heads=arch.num_heads,
        num_query_groups=arch.num_kv_heads,
        kv_channels=arch.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=arch.norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=arch.qkv_bias,
        qk_layernorm=arch.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=_tp_size(),
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=device.type == "cpu",
        perform_initialization=False,
    )
    with torch.device(device), parallel.megatron_device():
        model = GPTModel(
            config,
            get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=arch.qk_norm),
            vocab_size=vocab_rows,
            max_sequence_length=arch.max_positions,
            parallel_output=False,  # full-vocabulary logits on every rank
            share_embeddings_and_output_weights=arch.tied,
            position_embedding_type="rope",
            rotary_base=arch.rope_theta,
        )
    return model


def _tp_size() -> int:
    return parallel_state.get_tensor_model_parallel_world_size()


def _tp_rank() -> int:
    return parallel_state.get_tensor_model_parallel_rank()


class MegatronTrainerBackend(TrainerBackend):
    """PPO-clip / GRPO or M2PO over Megatron-core's GPT, on CPU or CUDA GPUs."""

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
        self.arch = convert.Architecture.from_hf(model_path)
        self.device = parallel.initialize(
            config.tensor_model_parallel_size, config.pipeline_model_parallel_size
        )
        hf_weights = convert.read_hf_weights(model_path)
        self.model = self._load(hf_weights).train()
        self.reference = None
        if config.kl_coef:
            self.reference = self._load(hf_weights).eval().requires_grad_(False)
        self.pad_token_id = self._pad_token_id()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=(config.beta1, config.beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.step = 0

    def _load(self, hf_weights: dict[str, torch.Tensor]) -> Any:
        rank, size = _tp_rank(), _tp_size()
        vocab_rows = convert.padded_vocab_size(self.arch.vocab_size, size)
        model = _build_model(self.arch, vocab_rows, self.dtype, self.device)
        full = convert.hf_to_megatron(hf_weights, self.arch, vocab_rows)
        state = {name: convert.shard(name, t, rank, size) for name, t in full.items()}
        params = dict(model.named_parameters())
        if state.keys() != params.keys():
            raise ValueError(
                f"{self.model_path}: checkpoint and Megatron model disagree on "
                f"{sorted(state.keys() ^ params.keys())}"
            )
        with torch.no_grad():
            for name, param in params.items():
                if state[name].shape != param.shape:
                    raise ValueError(
                        f"{self.model_path}: {name} has shape {tuple(state[name].shape)}, "
                        f"the model expects {tuple(param.shape)}"
                    )
                param.copy_(state[name])
        return model

    def _pad_token_id(self) -> int:
        pad = json.loads((Path(self.model_path) / "config.json").read_text()).get("pad_token_id")
        return 0 if pad is None else int(pad)

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
                    tokens=torch.tensor(
                        [padded(t.tokens, self.pad_token_id) for t in trajs], device=self.device
                    ),
                    mask=torch.tensor(
                        [padded(t.loss_mask, 0) for t in trajs],
                        dtype=torch.float,
                        device=self.device,
                    ),
                    old_logp=torch.tensor(
                        [padded(t.logprobs, 0.0) for t in trajs], device=self.device
                    ),
                    advantages=torch.tensor(
                        [[item.advantage] for item in chunk], device=self.device
                    ),
                    lengths=[len(t.tokens) for t in trajs],
                )
            )
        return out

    def _forward(self, model: Any, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[b, T, V]`` without vocabulary padding.

        The causal mask is explicit: Megatron's default one is built on CUDA.
        """
        width = tokens.shape[1]
        positions = torch.arange(width, device=self.device).expand_as(tokens)
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).triu(1)
        with parallel.megatron_device():
            logits = model(tokens, positions, causal[None, None])
        return logits[..., : self.arch.vocab_size]

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
            logits = self._forward(self.model, micro.tokens)
            logp = token_logprobs(logits, micro.tokens)
            ref_logp = None
            if self.reference is not None:
                with torch.no_grad():
                    ref_logits = self._forward(self.reference, micro.tokens)
                    ref_logp = token_logprobs(ref_logits, micro.tokens)
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
            with parallel.megatron_device():
                out.loss.backward()
            totals["loss"] += float(out.loss.detach())
            totals["clipped"] += float(out.clipped_tokens)
            totals["ratio"] += float(out.ratio_sum)
            totals["kl"] += float(out.kl_sum)
            totals["entropy"] += float((token_entropy(logits) * micro.mask).sum())
            diff = (logp.detach() - micro.old_logp).abs() * micro.mask
            totals["logp_diff"] += float(diff.sum())
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        grad_norm = self._clip_grad_norm(max_norm)
        self.optimizer.step()
        self.step += 1
        metrics = {
            "loss": totals["loss"],
            "grad_norm": grad_norm,
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

    def _clip_grad_norm(self, max_norm: float) -> float:
        """``clip_grad_norm_`` over the whole model, whichever rank holds which shard.

        Replicated parameters (norms) count once; sharded ones add their squares
        across tensor-parallel ranks.
        """
        if _tp_size() == 1:
            return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        grads = [(n, p.grad) for n, p in self.model.named_parameters() if p.grad is not None]
        sharded = sum(g.float().pow(2).sum() for n, g in grads if convert.split_dim(n) is not None)
        replicated = sum(g.float().pow(2).sum() for n, g in grads if convert.split_dim(n) is None)
        sharded = torch.as_tensor(sharded, device=self.device)
        dist.all_reduce(sharded, group=parallel_state.get_tensor_model_parallel_group())
        norm = float((sharded + replicated).sqrt())
        scale = max_norm / (norm + 1e-6)
        if scale < 1.0:
            for _, g in grads:
                g.mul_(scale)
        return norm

    def _clip(self, micros: list[_MicroBatch]) -> tuple[float, float] | None:
        """PPO's fixed bounds, or M2PO's from a no-grad pass over the whole batch."""
        if self.config.loss == "ppo":
            return (self.config.eps_low, self.config.eps_high)
        logps, olds, advs, masks = [], [], [], []
        with torch.no_grad():
            for micro in micros:
                logp = token_logprobs(self._forward(self.model, micro.tokens), micro.tokens)
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
            logp = token_logprobs(self._forward(self.model, micro.tokens), micro.tokens)
            out += [row[:n] for row, n in zip(logp.tolist(), micro.lengths, strict=True)]
        return out

    def _full_state(self) -> dict[str, torch.Tensor]:
        """Every parameter whole (gathered across tensor-parallel ranks), Megatron names."""
        params = {name: p.detach() for name, p in self.model.named_parameters()}
        size = _tp_size()
        if size == 1:
            return params
        group = parallel_state.get_tensor_model_parallel_group()
        full = {}
        for name, tensor in params.items():
            if convert.split_dim(name) is None:
                full[name] = tensor
                continue
            parts = [torch.empty_like(tensor) for _ in range(size)]
            dist.all_gather(parts, tensor.contiguous(), group=group)
            full[name] = convert.unshard(name, parts)
        return full

    def export_weights(self) -> dict[str, torch.Tensor]:
        """A snapshot (CPU copies) by Hugging Face names in ``export_dtype``."""
        hf = convert.megatron_to_hf(self._full_state(), self.arch)
        return {
            name: t.to(device="cpu", dtype=self.export_dtype, copy=True).contiguous()
            for name, t in hf.items()
        }

    # -- persistence ---------------------------------------------------------------

    def _shard_file(self, kind: str) -> str:
        return f"{kind}.safetensors" if _tp_size() == 1 else f"{kind}-tp{_tp_rank()}.safetensors"

    def save_checkpoint(self, path: str) -> None:
        """Parameters and AdamW moments as safetensors; step and hyperparameters as JSON.

        ``trainer_state.json`` is written last, so its presence marks a whole checkpoint.
        """
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        params = dict(self.model.named_parameters())
        save_file(
            {k: v.detach().contiguous() for k, v in params.items()},
            str(out / self._shard_file("model")),
        )
        names = {id(p): name for name, p in params.items()}
        moments = {
            f"{names[id(param)]}::{key}": value.detach().contiguous()
            for param, state in self.optimizer.state.items()
            for key, value in state.items()
        }
        save_file(moments, str(out / self._shard_file("optimizer")))
        if _tp_size() > 1:
            dist.barrier()
        if _tp_rank() == 0:
            groups = [
                {k: v for k, v in group.items() if k != "params"}
                for group in self.optimizer.state_dict()["param_groups"]
            ]
            state = {
                "format": _FORMAT,
                "step": self.step,
                "dtype": self.config.dtype,
                "tensor_model_parallel_size": _tp_size(),
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
        expected = {"dtype": self.config.dtype, "tensor_model_parallel_size": _tp_size()}
        for key, want in expected.items():
            if state[key] != want:
                raise ValueError(
                    f"{src} was saved with {key}={state[key]!r}, this trainer has {want!r}"
                )
        params = dict(self.model.named_parameters())
        saved = load_file(str(src / self._shard_file("model")), device=str(self.device))
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(saved[name])
        moments = load_file(str(src / self._shard_file("optimizer")), device=str(self.device))
        index = {name: i for i, name in enumerate(params)}
        per_param: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in moments.items():
            name, _, slot = key.rpartition("::")
            per_param.setdefault(index[name], {})[slot] = value
        current = self.optimizer.state_dict()["param_groups"]
        groups = [
            {**saved_group, "params": group["params"]}
            for saved_group, group in zip(state["param_groups"], current, strict=True)
        ]
        self.optimizer.load_state_dict({"state": per_param, "param_groups": groups})
        self.step = int(state["step"])

    def save_pretrained(self, path: str) -> None:
        """A Hugging Face checkpoint in the training dtype, with the source's config and tokenizer.

        The config is copied unchanged except ``dtype``, so ``transformers`` rebuilds
        exactly the architecture the weights were loaded from.
        """
        hf = convert.megatron_to_hf(self._full_state(), self.arch)
        if _tp_rank() != 0:
            return
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        for name in _HF_SIDE_FILES:
            if (Path(self.model_path) / name).exists():
                shutil.copy(Path(self.model_path) / name, out / name)
        config = json.loads((out / "config.json").read_text())
        config["dtype"] = self.config.dtype
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        if self.arch.tied:
            del hf["lm_head.weight"]  # transformers re-ties it to the embedding
        save_file(
            {k: v.to("cpu", copy=True).contiguous() for k, v in hf.items()},
            str(out / "model.safetensors"),
            metadata={"format": "pt"},
        )
