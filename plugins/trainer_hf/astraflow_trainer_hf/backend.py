"""``trainer=hf``: one policy's Hugging Face causal LM and its AdamW optimiser.

The step (micro-batching, losses, accumulation, metrics) is
:class:`astraflow.rl.policy_gradient.PolicyGradientBackend`, shared with every trainer
backend; this module owns the model, the optimiser and checkpoints.

With ``trainer.world_size`` > 1 (under ``torchrun``) the model is sharded with FSDP2:
every rank holds a slice of each parameter, gradient and AdamW moment, trains on its
share of each batch, and the published weights are gathered whole once, on rank 0.

Checkpoints are ``torch.distributed.checkpoint`` in its safetensors layout: every rank
writes its own shards, each file says in its header which slice it holds, and any
world size reads them back. Tensors are safetensors and everything else JSON: nothing
is pickled, so a checkpoint can be loaded from an untrusted directory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from transformers import AutoModelForCausalLM

from astraflow.lora import adapter_key, check_targets
from astraflow.models import hf_layout
from astraflow.models.router_replay import Replay, routers
from astraflow.rl import shared_prefix as share
from astraflow.rl.losses import token_logprobs
from astraflow.rl.options import lora_targets
from astraflow.rl.policy_gradient import MicroBatch, PolicyGradientBackend
from astraflow.rl.shared_prefix import SharedPrefix
from astraflow.text import copy_tokenizer_files
from astraflow_trainer_hf import check_config
from astraflow_trainer_hf.checkpoint_io import save_streaming, single_process_quiet
from astraflow_trainer_hf.lora import (
    WithoutAdapter,
    expert_wrappers,
    jsonable,
    merge_lora,
    peft_targets,
)

log = logging.getLogger(__name__)

def _load_model(path: str, dtype: torch.dtype, device: torch.device) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                local_files_only=True).to(device)


def resolve_device(name: str, sharded: bool = False) -> torch.device:
    """``auto``: the first CUDA device when there is one, else the CPU.

    A rank of a sharded trainer takes its own device: ``cuda:LOCAL_RANK`` (torchrun
    sets it), or the CPU.
    """
    if sharded and name in ("auto", "cuda") and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"device={name!r}: use auto, cpu, cuda or cuda:N ({exc})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={name!r} but torch sees no CUDA device here")
    return device


class HFTrainerBackend(PolicyGradientBackend):
    """PPO-clip / GRPO or M2PO over a ``transformers`` causal LM: on CPU or one device,
    or sharded with FSDP2 over the ranks of ``torchrun``."""

    checkpoint_format = 2
    #: where it trains (``trainer.device`` resolved)
    device: torch.device

    @classmethod
    def check_config(cls, config: Any) -> None:
        check_config(config)

    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)  # dtypes and torch threads
        self.sharded = dist.is_initialized() and dist.get_world_size() > 1
        if self.sharded:
            self.dp_rank, self.dp_size = dist.get_rank(), dist.get_world_size()
        self.device = resolve_device(config.device, self.sharded)
        if config.cpu_offload and self.device.type != "cuda":
            raise ValueError("trainer.cpu_offload=true moves FSDP2 shards off GPUs: torch "
                             "sees no CUDA device here")
        self.autocast = config.mixed_precision == "bfloat16" and not self.sharded
        self.lora = config.lora.rank > 0 if getattr(config, "lora", None) else False
        model = _load_model(model_path, self.dtype, self.device).train()
        if self.lora:
            model = self._adapt(model)
        self.model = self._prepare(model)
        self.reference = None
        if config.kl_coef and self.lora:  # the base is the adapter switched off: no copy
            self.reference = WithoutAdapter(self.model)
        elif config.kl_coef:
            self.reference = self._prepare(_load_model(model_path, self.dtype, self.device)
                                           .eval().requires_grad_(False))
        pad = self.model.config.pad_token_id
        self.pad_token_id: int = 0 if pad is None else int(pad)
        self.optimizer = torch.optim.AdamW(
            self._param_groups(),
            lr=config.lr,
            betas=(config.beta1, config.beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
        )
        self.step = 0
        # the prefix pass's cache is dropped under checkpointing; ranks would disagree
        # on which micro-batches share (and so on the collectives each runs)
        self.shared_prefix = (config.shared_prefix and not config.activation_checkpointing
                              and not self.sharded and not config.router_replay)
        self._prefix_checked = False
        #: counts how often this model routes otherwise than the engine did, and with
        #: ``router_replay`` routes as the engine did; None: no MoE router
        self.replay: Replay | None = None
        if config.router_replay or routers(self.model):
            self.replay = Replay(self.model)  # refuses a model without routers

    def _param_groups(self) -> list[dict[str, Any]]:
        """Only what trains has moments: with LoRA, the adapters alone, the B matrices
        in a group of their own under LoRA+ (``lr_scale`` times the learning rate)."""
        trained = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        ratio = self.config.lora.lr_ratio if self.lora else 1.0
        if ratio == 1.0:
            return [{"params": [p for _, p in trained], "lr_scale": 1.0}]
        return [{"params": [p for n, p in trained if ".lora_B." not in n], "lr_scale": 1.0},
                {"params": [p for n, p in trained if ".lora_B." in n], "lr_scale": ratio}]

    def _adapt(self, model: torch.nn.Module) -> torch.nn.Module:
        """Wrap ``model`` in ``peft`` LoRA adapters; the base weights are frozen."""
        try:
            from peft import LoraConfig, get_peft_model
        except ImportError:
            raise ImportError("trainer.lora.rank > 0 needs peft: pip install "
                              "'astraflow-plugin-trainer-hf[lora]'") from None
        lora = self.config.lora
        targets = lora_targets(lora)
        check_targets(targets, self.model_path)
        modules, parameters = peft_targets(model, targets)
        config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                            target_modules=modules, target_parameters=parameters or None,
                            task_type="CAUSAL_LM", bias="none")
        # the same adapters on every rank and in every run: A's random start is seeded
        with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
            warnings.simplefilter("ignore")  # tied embeddings: peft warns, we adapt none
            torch.manual_seed(0)
            return get_peft_model(model, config)

    def adapter_config(self) -> dict[str, Any] | None:
        """The ``peft`` adapter config (``adapter_config.json``) of a LoRA trainer."""
        if not self.lora:
            return None
        config = self.model.peft_config["default"]
        return json.loads(json.dumps(config.to_dict(), default=jsonable))

    def _prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Activation checkpointing, then FSDP2 over the ranks when there are several."""
        # tied weights (embeddings shared with the output layer) are published once,
        # under the first name, as the checkpoint itself stores them
        first: dict[int, str] = {}
        #: a tied name -> the name it shares its tensor with
        self.tied: dict[str, str] = {}
        for name, tensor in model.state_dict().items():
            if tensor.data_ptr() in first:
                self.tied[name] = first[tensor.data_ptr()]
            first.setdefault(tensor.data_ptr(), name)
        if self.config.activation_checkpointing and model.training:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        if not self.sharded:
            return model
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        options: dict[str, Any] = {"reshard_after_forward": self.config.reshard_after_forward}
        if self.config.mixed_precision == "bfloat16":
            options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                        reduce_dtype=self.dtype)
        if self.config.cpu_offload:
            options["offload_policy"] = CPUOffloadPolicy()
        for layer in _decoder_layers(model):
            fully_shard(layer, **options)
        fully_shard(model, **options)
        return model

    def _compute(self) -> contextlib.AbstractContextManager[Any]:
        if self.autocast:
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    keeps_columns = True

    def logits(self, model: torch.nn.Module, tokens: torch.Tensor,
               columns: tuple[int, int] | None = None) -> torch.Tensor:
        with self._compute():
            if columns is None:
                return model(input_ids=tokens, use_cache=False).logits.float()
            kept = torch.arange(*columns, device=tokens.device)
            return _kept_logits(model, kept, input_ids=tokens, use_cache=False).float()

    def prefix_logits(self, model: Any, split: SharedPrefix, kept: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        with self._compute():
            if kept is None:
                prefix = model(input_ids=split.tokens, attention_mask=split.mask,
                               use_cache=True)
            else:
                prefix = _kept_logits(model, kept, whole=True, input_ids=split.tokens,
                                      attention_mask=split.mask, use_cache=True)
            cache = prefix.past_key_values
            cache.batch_select_indices(split.rows)  # each item's group row, with gradient
            suffix = model(input_ids=split.suffix, attention_mask=split.attention_mask(),
                           position_ids=split.positions, past_key_values=cache,
                           use_cache=False)
        return prefix.logits, suffix.logits

    def _token_stats(self, model: Any, micro: MicroBatch, entropy: bool = False,
                     trained: bool = False,
                     ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if micro.prefix is not None and self.shared_prefix and not self._prefix_checked:
            self._prefix_checked = True
            self._check_shared_prefix(model, micro)
        if self.replay is None or micro.routing is None or model is not self.model:
            return super()._token_stats(model, micro, entropy, trained)
        # routing is per token of the whole sequence: one plain pass, prompts unshared
        with self.replay.routing(micro.routing, replay=self.config.router_replay):
            return super()._token_stats(model, dataclasses.replace(micro, prefix=None),
                                        entropy, trained)

    def train_step(self, batch: Any) -> dict[str, float]:
        metrics = super().train_step(batch)
        if self.replay is not None:
            metrics.update(self.replay.take())
        return metrics

    def _check_shared_prefix(self, model: Any, micro: MicroBatch) -> None:
        """Sharing stays on only if this model's cached-prefix passes give the plain
        pass's log-probs on a real micro-batch (a model whose forward ignores
        ``position_ids`` or the cache would train on wrong log-probs)."""
        split = micro.prefix
        assert split is not None  # checked on a micro-batch that shares a prefix
        with torch.no_grad():
            plain = token_logprobs(self.logits(model, micro.tokens), micro.tokens)
            shared, _ = share.token_stats(*self.prefix_logits(model, split), split)
        real = torch.arange(plain.shape[1], device=plain.device)[None] < torch.tensor(
            micro.lengths, device=plain.device)[:, None]
        gap = float(torch.where(real, (plain - shared).abs(), 0.0).max())
        # float32 passes of other shapes agree to rounding; bfloat16 ones to its precision
        tolerance = 1e-3 if self.dtype == torch.float32 and not self.autocast else 0.1
        if not gap <= tolerance:
            self.shared_prefix = False
            log.warning("trainer.shared_prefix: %s's cached-prefix pass differs from its "
                        "plain pass by %.3g in log-prob (more than %g): training without "
                        "sharing prompts (trainer.shared_prefix=false skips this check)",
                        type(self.model).__name__, gap, tolerance)

    def backward(self, loss: torch.Tensor) -> None:
        # FSDP averages gradients over the replicas; the loss is already normalised by
        # the whole batch's tokens, so the replicas' gradients must add up instead
        (loss * self.dp_size if self.sharded else loss).backward()

    # -- the rest of the contract -----------------------------------------------------

    def _full_state(self, trained_only: bool = False) -> dict[str, torch.Tensor]:
        """Every tensor whole, tied names once: on rank 0 only when sharded.

        ``trained_only``: the trained parameters alone (with LoRA, the adapters).
        """
        if self.sharded:
            state = get_model_state_dict(self.model, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True, ignore_frozen_params=trained_only))
        elif trained_only:
            state = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        else:
            state = self.model.state_dict()
        return {name: t for name, t in state.items() if name not in self.tied}

    def export_weights(self) -> dict[str, torch.Tensor]:
        """A snapshot (copies) in ``export_dtype``: later steps never change it.

        Under the checkpoint's tensor names and layout, whatever the model holds in
        memory. With LoRA, the adapters alone, under ``peft``'s names. Sharded, the tensors are
        gathered once and only rank 0 (the publisher) gets them; the other ranks get an
        empty dict.
        """
        if self.lora:
            return {adapter_key(name): t.detach().to(device="cpu", dtype=self.export_dtype,
                                                     copy=True)
                    for name, t in self._full_state(trained_only=True).items()}
        # under the checkpoint's names and layout (one matrix per expert where the model
        # holds its experts fused): what engines and from_pretrained load
        state = hf_layout.to_checkpoint(self.model, self._full_state())
        return {name: tensor.detach().to(device="cpu", dtype=self.export_dtype, copy=True)
                for name, tensor in state.items()}

    # -- persistence ---------------------------------------------------------------

    def save_checkpoint(self, path: str) -> None:
        """Model and AdamW moments by every rank as safetensors shards; step and
        hyperparameters as JSON.

        ``trainer_state.json`` is written last, so its presence marks a whole checkpoint.
        """
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        model_state, optim_state = get_state_dict(self.model, self.optimizer,
                                                  options=self._state_options())
        model_state = {k: v for k, v in model_state.items() if k not in self.tied}
        state = {"model": model_state, "optim": optim_state["state"]}
        if self.sharded or not save_streaming(state, out):
            with single_process_quiet():
                dcp.save(state, storage_writer=dcp.HuggingFaceStorageWriter(
                    str(out), save_distributed=True), no_dist=not self.sharded)
        if self.sharded and dist.get_rank() != 0:
            return
        groups = [{k: v for k, v in group.items() if k != "params"}
                  for group in optim_state["param_groups"]]
        state = {
            "format": self.checkpoint_format,
            "step": self.step,
            "dtype": self.config.dtype,
            "world_size": self.dp_size,
            "lora_rank": self.config.lora.rank if self.lora else 0,
            "param_groups": groups,
        }
        (out / self.state_file).write_text(json.dumps(state, indent=2))

    def load_checkpoint(self, path: str) -> None:
        """What :meth:`save_checkpoint` wrote, at this trainer's world size whatever it
        was saved at."""
        src = Path(path)
        state = self.checkpoint_state(path)
        rank = self.config.lora.rank if self.lora else 0
        if state.get("lora_rank", 0) != rank:
            raise ValueError(f"{src} holds a trainer with trainer.lora.rank="
                             f"{state.get('lora_rank', 0)}, this one has {rank}")
        # asking for the optimiser's state dict creates its moments, shaped for this world
        model_state, optim_state = get_state_dict(self.model, self.optimizer,
                                                  options=self._state_options())
        loaded = {"model": {k: v for k, v in model_state.items() if k not in self.tied},
                  "optim": optim_state["state"]}
        with single_process_quiet():
            dcp.load(loaded, storage_reader=dcp.HuggingFaceStorageReader(str(src)),
                     no_dist=not self.sharded)
        for name, source in self.tied.items():
            loaded["model"][name] = loaded["model"][source]
        if len(state["param_groups"]) != len(optim_state["param_groups"]):
            raise ValueError(f"{src} was saved with trainer.lora.lr_ratio "
                             f"{'=1' if len(state['param_groups']) == 1 else '!=1'}; this "
                             "trainer's differs (LoRA+ keeps B matrices in a group apart)")
        groups = [
            # this run's lr_ratio, not the saved one: it may be changed on resuming
            {**saved, "params": group["params"], "lr_scale": group["lr_scale"]}
            for saved, group in zip(state["param_groups"], optim_state["param_groups"],
                                    strict=True)
        ]
        set_state_dict(self.model, self.optimizer, model_state_dict=loaded["model"],
                       optim_state_dict={"state": loaded["optim"], "param_groups": groups},
                       # with LoRA the frozen base is not in a checkpoint: it is model.path
                       options=StateDictOptions(strict=not self.lora))
        self.step = int(state["step"])

    def _state_options(self) -> StateDictOptions:
        """A LoRA checkpoint holds the adapters and their moments, not the base."""
        return StateDictOptions(ignore_frozen_params=self.lora)

    def save_pretrained(self, path: str) -> None:
        """The model in its training dtype, plus the tokenizer files it was loaded with
        (gathered and written by rank 0 when sharded).

        With LoRA: the adapter in ``peft`` format (``adapter_config.json``,
        ``adapter_model.safetensors``), and with ``trainer.lora.merge_final`` the merged
        model in ``merged/``.
        """
        if self.lora:
            self._save_adapter(path)
            return
        if not self.sharded:
            self.model.save_pretrained(path)
        else:
            state = get_model_state_dict(self.model, options=StateDictOptions(
                full_state_dict=True, cpu_offload=True))
            if dist.get_rank() != 0:
                return
            self.model.save_pretrained(path, state_dict=state)
        copy_tokenizer_files(self.model_path, path)


    def _save_adapter(self, path: str) -> None:
        adapter = self._full_state(trained_only=True)
        merged = None
        if self.config.lora.merge_final:
            merged = merge_lora(self._full_state(), self.config.lora.alpha / self.config.lora.rank,
                                expert_wrappers(self.model))
        if self.sharded and dist.get_rank() != 0:
            return
        self.model.save_pretrained(path, state_dict=adapter)
        self.model.peft_config["default"].base_model_name_or_path = self.model_path
        self.model.peft_config["default"].save_pretrained(path)
        if merged is not None:
            out = Path(path) / "merged"
            base = self.model.get_base_model()
            base.save_pretrained(out, state_dict=merged)
            copy_tokenizer_files(self.model_path, out)


def _kept_logits(model: Any, kept: torch.Tensor, whole: bool = False, **inputs: Any) -> Any:
    """``model``'s logits at the sequence columns ``kept`` alone: ``transformers``'
    ``logits_to_keep`` where the model takes it, else all of them, then those columns.

    ``whole``: the model's whole output, its logits those columns' (a prefix pass's
    cache is wanted too); else the logits alone.
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    if "logits_to_keep" in inspect.signature(inner.forward).parameters:
        out = model(**inputs, logits_to_keep=kept)
    else:
        out = model(**inputs)
        out.logits = out.logits[:, kept]
    return out if whole else out.logits


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks (what ``transformers`` never splits across devices)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(model).__name__} names no decoder layer class "
                         "(_no_split_modules): FSDP2 cannot tell where to shard it")
    return layers
