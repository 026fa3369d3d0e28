"""``trainer=megatron``: one policy as a Megatron-core ``GPTModel`` and its AdamW optimiser.

The model is built from a Hugging Face Llama/Qwen checkpoint (:mod:`.convert`) and
exported by Hugging Face names, so rollout engines never see Megatron's layout.
Batches are handled exactly as by ``trainer=hf``: right-padded sequences under a
causal mask, each item's advantage broadcast over its trained tokens, gradients
accumulated over micro-batches with the loss normalised by the trained tokens of the
whole batch, and the losses of :mod:`astraflow.rl.losses`.

The optimiser is ``torch.optim.AdamW`` over the bare model: Megatron's distributed
optimiser and its DDP wrapper need CUDA. With data parallelism (``world_size`` above
``tensor_model_parallel_size``) each replica trains on its share of the batch and the
gradients are summed over the replicas by one all-reduce per step. Exports and
``save_pretrained`` gather the full tensors within a tensor-parallel group.

Checkpoints hold tensors in safetensors (Megatron names, one file per tensor-parallel
rank, written by the first replica) and everything else in JSON: nothing is pickled.
A checkpoint saved at one tensor-parallel size loads at another (the shards are
joined and split again), and at any number of replicas.
"""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from astraflow.rl.policy_gradient import PolicyGradientBackend, dtype_of
from astraflow.text import copy_tokenizer_files

with warnings.catch_warnings():
    # Transformer Engine and Apex are optional accelerators: Megatron falls back to torch
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).* not installed")
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from astraflow_trainer_megatron import convert, parallel

_STATE_FILE = "trainer_state.json"
_FORMAT = 1


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


class MegatronTrainerBackend(PolicyGradientBackend):
    """PPO-clip / GRPO or M2PO over Megatron-core's GPT, on CPU or CUDA GPUs."""

    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)
        self.dtype = dtype_of(config.dtype, "dtype")
        self.export_dtype = dtype_of(config.export_dtype, "export_dtype")
        if config.num_threads > 0:
            torch.set_num_threads(config.num_threads)
        self.arch = convert.Architecture.from_hf(model_path)
        self.device = parallel.initialize(
            config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
            max(1, math.ceil(config.collective_timeout / 60)),
        )
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_group = parallel_state.get_data_parallel_group()
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

    def logits(self, model: Any, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[b, T, V]`` without vocabulary padding.

        The causal mask is explicit: Megatron's default one is built on CUDA.
        """
        width = tokens.shape[1]
        positions = torch.arange(width, device=self.device).expand_as(tokens)
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).triu(1)
        with parallel.megatron_device():
            logits = model(tokens, positions, causal[None, None])
        return logits[..., : self.arch.vocab_size]

    def backward(self, loss: torch.Tensor) -> None:
        with parallel.megatron_device():
            loss.backward()

    def reduce_gradients(self) -> None:
        """One all-reduce over the replicas for every gradient, flattened together."""
        if self.dp_size == 1:
            return
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([g.flatten() for g in grads])
        dist.all_reduce(flat, group=self.dp_group)
        for g, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            g.copy_(part.view_as(g))

    def clip_grad_norm(self, max_norm: float) -> float:
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
        if self.arch.tied:  # stored once, as in the checkpoint: engines re-tie it
            del hf["lm_head.weight"]
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
        if self.dp_rank != 0:  # the replicas hold the same numbers
            dist.barrier()
            return
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
        if dist.get_world_size() > 1:
            dist.barrier()
        if dist.get_rank() == 0:
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
        if state["dtype"] != self.config.dtype:
            raise ValueError(f"{src} was saved with dtype={state['dtype']!r}, this trainer "
                             f"has {self.config.dtype!r}")
        params = dict(self.model.named_parameters())
        saved = self._read_shards(src, "model", state["tensor_model_parallel_size"])
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(saved[name])
        moments = self._read_shards(src, "optimizer", state["tensor_model_parallel_size"])
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

    def _read_shards(self, src: Path, kind: str, saved_tp: int) -> dict[str, torch.Tensor]:
        """This rank's part of every tensor in ``kind`` files saved at ``saved_tp`` ranks.

        At another tensor-parallel size each tensor is joined from the saved parts and
        split again; the vocabulary rows are padded anew for this size.
        """
        if saved_tp == _tp_size():
            return load_file(str(src / self._shard_file(kind)), device=str(self.device))
        names = [f"{kind}.safetensors"] if saved_tp == 1 else [
            f"{kind}-tp{r}.safetensors" for r in range(saved_tp)]
        parts = [load_file(str(src / name)) for name in names]
        rows = convert.padded_vocab_size(self.arch.vocab_size, _tp_size())
        out = {}
        for key in parts[0]:
            name = key.partition("::")[0]
            if parts[0][key].dim() == 0:  # an optimiser's step count
                out[key] = parts[0][key].to(self.device)
                continue
            full = convert.unshard(name, [p[key] for p in parts])
            if name.endswith(("word_embeddings.weight", "output_layer.weight")):
                full = convert.pad_rows(full[: self.arch.vocab_size], rows)
            out[key] = convert.shard(name, full, _tp_rank(), _tp_size()).to(self.device)
        return out

    def save_pretrained(self, path: str) -> None:
        """A Hugging Face checkpoint in the training dtype, with the source's config and tokenizer.

        The config is copied unchanged except ``dtype``, so ``transformers`` rebuilds
        exactly the architecture the weights were loaded from.
        """
        hf = convert.megatron_to_hf(self._full_state(), self.arch)
        if dist.get_rank() != 0:
            return
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(Path(self.model_path) / "config.json", out / "config.json")
        copy_tokenizer_files(self.model_path, out)
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
