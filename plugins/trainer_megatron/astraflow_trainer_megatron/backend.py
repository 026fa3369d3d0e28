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

With pipeline stages (``pipeline_model_parallel_size``) each rank builds its stage's
layers; a micro-batch's activations go forward stage by stage and their gradients come
back (one micro-batch at a time: stages split the memory, not the time), and the last
stage's metrics and log-probs are broadcast to the others.

Checkpoints hold tensors in safetensors (whole-model Megatron names, one file per
tensor-parallel rank and stage, written by the first replica) and everything else in
JSON: nothing is pickled. A checkpoint saved at one layout loads at another (the
shards are joined and split again), and at any number of replicas.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open
from safetensors.torch import save_file

from astraflow.rl.policy_gradient import PolicyGradientBackend
from astraflow.text import copy_tokenizer_files
from astraflow_trainer_megatron import check_config
from astraflow_trainer_megatron.model import (  # Megatron imported there, quietly
    _LAYER,
    _build_model,
    _ep_rank,
    _ep_size,
    _expert,
    _pp_rank,
    _pp_size,
    _renumber_expert,
    _tp_rank,
    _tp_size,
    convert,
    get_transformer_layer_offset,
    parallel,
    parallel_state,
)


class MegatronTrainerBackend(PolicyGradientBackend):
    """PPO-clip / GRPO or M2PO over Megatron-core's GPT, on CPU or CUDA GPUs."""

    checkpoint_format = 1

    @classmethod
    def check_config(cls, config: Any) -> None:
        check_config(config)

    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)  # dtypes and torch threads
        check_config(config, model_path)  # the checkpoint and the layout together
        self.arch = convert.Architecture.from_hf(model_path)
        if self.arch.num_layers % config.pipeline_model_parallel_size:
            raise ValueError(
                f"{model_path} has {self.arch.num_layers} layers: not divisible into "
                f"trainer.pipeline_model_parallel_size={config.pipeline_model_parallel_size} "
                "equal stages")
        self.device = parallel.initialize(
            config.tensor_model_parallel_size, config.pipeline_model_parallel_size,
            max(1, math.ceil(config.collective_timeout / 60)),
            expert_parallel=config.expert_model_parallel_size,
        )
        #: experts each expert-parallel rank holds of every MoE layer
        self.local_experts = self.arch.num_experts // _ep_size()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_group = parallel_state.get_data_parallel_group()
        self.first_stage = parallel_state.is_pipeline_first_stage()
        self.last_stage = parallel_state.is_pipeline_last_stage()
        #: a pipeline stage's pending micro-batch: its output and its input activations
        self._stage: tuple[torch.Tensor, torch.Tensor | None] | None = None
        hf_weights = convert.read_hf_weights(model_path)
        self.model = self._load(hf_weights).train()
        #: the parameters of experts (split over expert-parallel ranks), found once
        self.expert_params = {n for n, _ in self.model.named_parameters()
                              if _expert(n) is not None}
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

    # -- pipeline stages: parameter names, and activations between stages ---------------

    def _global(self, name: str, ep_rank: int | None = None) -> str:
        """A parameter's name in the whole model: this stage's layers renumbered, and
        an expert numbered among all experts (as ``ep_rank`` holds it; default: this
        rank)."""
        match = _LAYER.match(name)
        if match is None:
            return name
        name = f"decoder.layers.{int(match[1]) + self.layer_offset}.{name[match.end():]}"
        expert = _expert(name)
        if expert is not None:
            rank = _ep_rank() if ep_rank is None else ep_rank
            name = _renumber_expert(name, rank * self.local_experts + expert)
        return name

    def _local(self, name: str) -> str | None:
        """A whole-model name as this stage and expert rank call it (None: another
        stage's or another expert-parallel rank's)."""
        match = _LAYER.match(name)
        if match is None:
            return name
        local = int(match[1]) - self.layer_offset
        if not 0 <= local < self.num_local_layers:
            return None
        name = f"decoder.layers.{local}.{name[match.end():]}"
        expert = _expert(name)
        if expert is not None:
            if expert // self.local_experts != _ep_rank():
                return None
            name = _renumber_expert(name, expert % self.local_experts)
        return name

    def _pp_peer(self, stage: int) -> int:
        return dist.get_process_group_ranks(parallel_state.get_pipeline_model_parallel_group())[
            stage]

    def _from_last_stage(self, values: list[float]) -> list[float]:
        if _pp_size() == 1:
            return values
        flat = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.broadcast(flat, self._pp_peer(_pp_size() - 1),
                       group=parallel_state.get_pipeline_model_parallel_group())
        return flat.tolist()

    def _load(self, hf_weights: dict[str, torch.Tensor]) -> Any:
        rank, size = _tp_rank(), _tp_size()
        vocab_rows = convert.padded_vocab_size(self.arch.vocab_size, size)
        model = _build_model(self.arch, vocab_rows, self.dtype, self.device)
        self.layer_offset = get_transformer_layer_offset(model.config)
        self.num_local_layers = len(model.decoder.layers)
        full = convert.hf_to_megatron(hf_weights, self.arch, vocab_rows)
        if self.arch.tied and not self.first_stage:
            # the last stage's output layer is the first stage's embedding, kept in step
            # by summing their gradients (reduce_gradients)
            full["output_layer.weight"] = full["embedding.word_embeddings.weight"]
        params = dict(model.named_parameters())
        state = {}
        for name, tensor in full.items():
            local = self._local(name)
            # another stage's layer, or the embedding / output layer of another stage
            if local is not None and (_pp_size() == 1 or local in params):
                state[local] = convert.shard(name, tensor, rank, size)
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

    def logits(self, model: Any, tokens: torch.Tensor) -> torch.Tensor | None:
        """Logits ``[b, T, V]`` without vocabulary padding (None before the last stage).

        The causal mask is explicit: Megatron's default one is built on CUDA. With
        experts split over ranks, every rank's forward gathers the others' tokens in
        equal shares: the ranks pad their micro-batches to one shape (rows and columns
        of padding, whose logits are cut off again).
        """
        rows, columns = tokens.shape
        if _ep_size() > 1:
            shape = torch.tensor([rows, columns], device=self.device)
            dist.all_reduce(shape, op=dist.ReduceOp.MAX,
                            group=parallel_state.get_expert_model_parallel_group())
            tokens = torch.nn.functional.pad(
                tokens, (0, int(shape[1]) - columns, 0, int(shape[0]) - rows),
                value=self.pad_token_id)
        out = self._logits(model, tokens)
        return None if out is None else out[:rows, :columns]

    def _logits(self, model: Any, tokens: torch.Tensor) -> torch.Tensor | None:
        width = tokens.shape[1]
        positions = torch.arange(width, device=self.device).expand_as(tokens)
        causal = torch.ones(width, width, dtype=torch.bool, device=self.device).triu(1)
        hidden_in = None
        if not self.first_stage:  # the previous stage's activations, [T, b, hidden]
            hidden_in = torch.empty(width, tokens.shape[0], self.arch.hidden_size,
                                    dtype=self.dtype, device=self.device)
            dist.recv(hidden_in, self._pp_peer(_pp_rank() - 1))
            hidden_in.requires_grad_(torch.is_grad_enabled())
            model.set_input_tensor(hidden_in)
        with parallel.megatron_device():
            out = model(tokens, positions, causal[None, None])
        if model is self.model and torch.is_grad_enabled():
            self._stage = (out, hidden_in)
        if not self.last_stage:
            dist.send(out.detach().contiguous(), self._pp_peer(_pp_rank() + 1))
            return None
        return out[..., : self.arch.vocab_size]

    def backward(self, loss: torch.Tensor | None) -> None:
        """Backward through this stage: from the loss on the last stage, else from the
        gradient the next stage sends back; then the input's gradient goes to the
        previous stage."""
        out, hidden_in = self._stage if self._stage is not None else (None, None)
        self._stage = None
        with parallel.megatron_device():
            if loss is not None:
                loss.backward()
            else:
                assert out is not None  # a stage before the last kept its output
                grad = torch.empty_like(out)
                dist.recv(grad, self._pp_peer(_pp_rank() + 1))
                out.backward(grad)
        if hidden_in is not None:
            dist.send(hidden_in.grad.contiguous(), self._pp_peer(_pp_rank() - 1))

    def reduce_gradients(self) -> None:
        """One all-reduce over the replicas for every gradient, flattened together; with
        tied embeddings over pipeline stages, the first stage's embedding and the last
        stage's output layer (one tensor of the model) sum their gradients."""
        if self.arch.tied and _pp_size() > 1 and (self.first_stage or self.last_stage):
            shared = dict(self.model.named_parameters())[
                "embedding.word_embeddings.weight" if self.first_stage
                else "output_layer.weight"]
            dist.all_reduce(shared.grad, group=parallel_state.get_embedding_group())
        if self.dp_size == 1:  # no replica, of the experts either
            return
        # an expert's gradient already sums the tokens of every rank its experts are
        # split over (they were all-gathered to it): it is summed over the replicas of
        # the same experts alone
        grads = [(p.grad, n in self.expert_params) for n, p in self.model.named_parameters()
                 if p.grad is not None]
        for expert, group, size in (
                (False, self.dp_group, self.dp_size),
                (True, parallel_state.get_expert_data_parallel_group(),
                 parallel_state.get_expert_data_parallel_world_size())):
            mine = [g for g, is_expert in grads if is_expert == expert]
            if size == 1 or not mine:
                continue
            flat = torch.cat([g.flatten() for g in mine])
            dist.all_reduce(flat, group=group)
            for g, part in zip(mine, flat.split([g.numel() for g in mine]), strict=True):
                g.copy_(part.view_as(g))

    def clip_grad_norm(self, max_norm: float) -> float:
        """``clip_grad_norm_`` over the whole model, whichever rank holds which shard.

        Replicated parameters (norms) count once; sharded ones add their squares
        across tensor-parallel ranks, and pipeline stages add theirs (a tied output
        layer is the first stage's embedding: counted there).
        """
        if _tp_size() == 1 and _pp_size() == 1 and _ep_size() == 1:
            return float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm))
        grads = [(n, p.grad) for n, p in self.model.named_parameters() if p.grad is not None]
        counted = [(n, g) for n, g in grads if not (
            self.arch.tied and n == "output_layer.weight" and not self.first_stage)]
        zero = torch.zeros((), device=self.device)
        experts = sum((g.float().pow(2).sum() for n, g in counted
                       if n in self.expert_params), zero)
        dense = [(n, g) for n, g in counted if n not in self.expert_params]
        sharded = sum((g.float().pow(2).sum() for n, g in dense
                       if convert.split_dim(n) is not None), zero)
        replicated = sum((g.float().pow(2).sum() for n, g in dense
                          if convert.split_dim(n) is None), zero)
        if _tp_size() > 1:
            dist.all_reduce(sharded, group=parallel_state.get_tensor_model_parallel_group())
        if _ep_size() > 1:  # each expert-parallel rank holds its own experts
            dist.all_reduce(experts, group=parallel_state.get_expert_model_parallel_group())
        total = sharded + replicated + experts
        if _pp_size() > 1:
            dist.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
        norm = float(total.sqrt())
        scale = max_norm / (norm + 1e-6)
        if scale < 1.0:
            for _, g in grads:
                g.mul_(scale)
        return norm

    def _full_state(self) -> dict[str, torch.Tensor]:
        """Every parameter whole, by whole-model Megatron names: gathered across
        tensor-parallel ranks, then from every pipeline stage onto the first (the other
        stages get an empty dict)."""
        params = {name: p.detach() for name, p in self.model.named_parameters()}
        size = _tp_size()
        full = {}
        group = parallel_state.get_tensor_model_parallel_group()
        ep_group = parallel_state.get_expert_model_parallel_group()
        for name, tensor in params.items():
            if name in self.expert_params and _ep_size() > 1:  # from every expert rank
                parts = [torch.empty_like(tensor) for _ in range(_ep_size())]
                dist.all_gather(parts, tensor.contiguous(), group=ep_group)
                full.update({self._global(name, rank): part for rank, part in enumerate(parts)})
                continue
            if size == 1 or convert.split_dim(name) is None:
                full[self._global(name)] = tensor
                continue
            parts = [torch.empty_like(tensor) for _ in range(size)]
            dist.all_gather(parts, tensor.contiguous(), group=group)
            full[self._global(name)] = convert.unshard(name, parts)
        if self.arch.tied and _pp_size() > 1:
            full.pop("output_layer.weight", None)  # the first stage's embedding
        return self._gather_stages(full)

    def _gather_stages(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each later pipeline stage sends its tensors (names first, as JSON) to the first."""
        if _pp_size() == 1:
            return state
        if not self.first_stage:
            meta = json.dumps([[n, list(t.shape)] for n, t in state.items()]).encode()
            first = self._pp_peer(0)
            dist.send(torch.tensor([len(meta)], dtype=torch.int64, device=self.device), first)
            dist.send(torch.tensor(list(meta), dtype=torch.uint8, device=self.device), first)
            for tensor in state.values():
                dist.send(tensor.contiguous(), first)
            return {}
        out = dict(state)
        for stage in range(1, _pp_size()):
            peer = self._pp_peer(stage)
            size = torch.zeros(1, dtype=torch.int64, device=self.device)
            dist.recv(size, peer)
            raw = torch.empty(int(size), dtype=torch.uint8, device=self.device)
            dist.recv(raw, peer)
            for name, shape in json.loads(bytes(raw.tolist())):
                out[name] = torch.empty(shape, dtype=self.dtype, device=self.device)
                dist.recv(out[name], peer)
        return out

    def export_weights(self) -> dict[str, torch.Tensor]:
        """A snapshot (CPU copies) by Hugging Face names in ``export_dtype`` (on the
        first pipeline stage; the other stages get an empty dict)."""
        full = self._full_state()
        if not full:
            return {}
        hf = convert.megatron_to_hf(full, self.arch)
        if self.arch.tied:  # stored once, as in the checkpoint: engines re-tie it
            del hf["lm_head.weight"]
        return {
            name: t.to(device="cpu", dtype=self.export_dtype, copy=True).contiguous()
            for name, t in hf.items()
        }

    # -- persistence ---------------------------------------------------------------

    @staticmethod
    def _shard_file(kind: str, tp_rank: int, pp_rank: int, tp: int, pp: int,
                    ep_rank: int = 0, ep: int = 1) -> str:
        return (f"{kind}{f'-tp{tp_rank}' if tp > 1 else ''}{f'-pp{pp_rank}' if pp > 1 else ''}"
                f"{f'-ep{ep_rank}' if ep > 1 else ''}.safetensors")

    def save_checkpoint(self, path: str) -> None:
        """Parameters and AdamW moments as safetensors, by whole-model names, one file
        per tensor-parallel rank and pipeline stage; step and hyperparameters as JSON.

        ``trainer_state.json`` is written last, so its presence marks a whole checkpoint.
        """
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        params = dict(self.model.named_parameters())
        # the replicas hold the same numbers: the first writes; experts split over
        # expert-parallel ranks are written by the first replica of each, in a file of
        # its own
        if parallel_state.get_expert_data_parallel_rank() != 0:
            dist.barrier()
            return
        if self.dp_rank != 0:
            params = {k: v for k, v in params.items() if k in self.expert_params}
        mine = self._shard_file("{}", _tp_rank(), _pp_rank(), _tp_size(), _pp_size(),
                                _ep_rank(), _ep_size())
        save_file({self._global(k): v.detach().contiguous() for k, v in params.items()},
                  str(out / mine.format("model")))
        names = {id(p): self._global(name) for name, p in params.items()}
        moments = {
            f"{names[id(param)]}::{key}": value.detach().contiguous()
            for param, state in self.optimizer.state.items() if id(param) in names
            for key, value in state.items()
        }
        save_file(moments, str(out / mine.format("optimizer")))
        if dist.get_world_size() > 1:
            dist.barrier()
        if dist.get_rank() == 0:
            groups = [
                {k: v for k, v in group.items() if k != "params"}
                for group in self.optimizer.state_dict()["param_groups"]
            ]
            state = {
                "format": self.checkpoint_format,
                "step": self.step,
                "dtype": self.config.dtype,
                "tensor_model_parallel_size": _tp_size(),
                "pipeline_model_parallel_size": _pp_size(),
                "expert_model_parallel_size": _ep_size(),
                "param_groups": groups,
            }
            (out / self.state_file).write_text(json.dumps(state, indent=2))

    def load_checkpoint(self, path: str) -> None:
        """What :meth:`save_checkpoint` wrote, at whatever tensor-parallel size, pipeline
        stages and replicas it was saved with."""
        src = Path(path)
        state = self.checkpoint_state(path)
        layout = (state["tensor_model_parallel_size"],
                  state.get("pipeline_model_parallel_size", 1),
                  state.get("expert_model_parallel_size", 1))
        params = dict(self.model.named_parameters())
        saved = self._read_shards(src, "model", *layout)
        missing = sorted(set(params) - set(saved))
        if missing:
            raise ValueError(f"{src} lacks {missing[:3]}: not a checkpoint of this model")
        with torch.no_grad():
            for name, param in params.items():
                param.copy_(saved[name])
        moments = self._read_shards(src, "optimizer", *layout)
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

    def _read_shards(self, src: Path, kind: str, saved_tp: int,
                     saved_pp: int, saved_ep: int = 1) -> dict[str, torch.Tensor]:
        """This rank's part of each tensor of ``kind`` that its stage holds, by this
        stage's names, from files saved at ``saved_tp`` x ``saved_pp`` ranks.

        A tensor is joined from its tensor-parallel parts and split again for this size
        (vocabulary rows padded anew); a tied output layer on a later stage is read
        from the embedding when the checkpoint has no stage that held it apart.
        """
        params = dict(self.model.named_parameters())
        index: dict[str, list[Any]] = {}
        with contextlib.ExitStack() as stack:
            for pp_rank, ep_rank in itertools.product(range(saved_pp), range(saved_ep)):
                handles = [stack.enter_context(safe_open(
                    str(src / self._shard_file(kind, tp_rank, pp_rank, saved_tp, saved_pp,
                                               ep_rank, saved_ep)),
                    framework="pt")) for tp_rank in range(saved_tp)]
                for key in handles[0].keys():  # noqa: SIM118 (a safetensors handle)
                    index[key] = handles
            rows = convert.padded_vocab_size(self.arch.vocab_size, _tp_size())
            out = {}
            for key, handles in index.items():
                name, sep, slot = key.partition("::")
                targets = [self._local(name)]
                tied_output = "output_layer.weight" + sep + slot
                if (name == "embedding.word_embeddings.weight" and self.arch.tied
                        and "output_layer.weight" in params and tied_output not in index):
                    targets.append("output_layer.weight")
                for target in targets:
                    if target is None or target not in params:
                        continue
                    parts = [h.get_tensor(key) for h in handles]
                    if parts[0].dim() == 0:  # an optimiser's step count
                        out[target + sep + slot] = parts[0].to(self.device)
                        continue
                    full = convert.unshard(name, parts)
                    if name.endswith(("word_embeddings.weight", "output_layer.weight")):
                        full = convert.pad_rows(full[: self.arch.vocab_size], rows)
                    out[target + sep + slot] = convert.shard(
                        target, full, _tp_rank(), _tp_size()).to(self.device)
        return out

    def save_pretrained(self, path: str) -> None:
        """A Hugging Face checkpoint in the training dtype, with the source's config and tokenizer.

        The config is copied unchanged except ``dtype``, so ``transformers`` rebuilds
        exactly the architecture the weights were loaded from.
        """
        full = self._full_state()
        if dist.get_rank() != 0:
            return
        hf = convert.megatron_to_hf(full, self.arch)
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
