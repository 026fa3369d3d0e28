"""LoRA tenants on one frozen base model: training (Tinker's losses, AdamW) and sampling.

One copy of the base weights; each tenant is a peft adapter with its own AdamW moments,
and each saved sampler a read-only adapter beside them. Calls come from one thread;
before each, the adapter it concerns is made the active one (``set_adapter``), so a
tenant's gradients, which accumulate on its own adapter parameters until its
``optim_step``, never meet another's. Tenants and samplers are peft adapters under
internal names (``t<n>``, ``s<n>``): the service's names may hold dots, which peft's
module keys cannot.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.tuners_utils import BaseTunerLayer
from transformers import AutoModelForCausalLM, AutoTokenizer

from astraflow_tinker.losses import EngineError, adamw, gather_logprobs, resolve
from astraflow_tinker.sampling import Sample, SampleRequest, decode, generator_for, pick
from astraflow_tinker.statefiles import (
    config_hash,
    copy_into,
    load_tensors,
    save_tensors,
    strip_prefix,
    write_atomically,
)

LORA_ALPHA = 32
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
#: a forward takes at most this many sequences, padded tokens, and logits (fp32 elements)
MICRO_SEQS, MICRO_TOKENS, MICRO_LOGITS = 64, 16384, 2**28
STATE_FORMAT = "astraflow-tinker-state/1"
STATE_JSON, ADAPTER_JSON = "tinker_state.json", "adapter_config.json"
ADAPTER_WEIGHTS, OPTIMIZER_WEIGHTS = "adapter_model.safetensors", "optimizer.safetensors"


@dataclass
class LoraSpec:
    rank: int = 32
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


@dataclass
class Datum:
    tokens: list[int]
    #: ``loss_fn_inputs`` by name, 1-D arrays of ``len(tokens)``
    inputs: dict[str, np.ndarray]


@dataclass
class AdamParams:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass
class _Tenant:
    spec: LoraSpec
    adapter: str
    #: the adapter's parameters by their key in peft's saved format
    params: dict[str, torch.nn.Parameter]
    exp_avg: dict[str, torch.Tensor] = field(default_factory=dict)
    exp_avg_sq: dict[str, torch.Tensor] = field(default_factory=dict)
    step: int = 0

    def reset_optimizer(self) -> None:
        self.exp_avg = {k: torch.zeros_like(p) for k, p in self.params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p) for k, p in self.params.items()}
        self.step = 0


class Engine:
    """LoRA tenants and read-only samplers on the base model in ``model_dir``."""

    def __init__(self, model_dir: str | Path, max_tenants: int = 64,
                 dtype: str = "float32") -> None:
        """``dtype``: the frozen base weights' (``float32``, ``bfloat16``; ``auto``:
        bfloat16 on a GPU, float32 on the CPU); adapters and their moments are float32."""
        self.model_dir = Path(model_dir)
        self.base_name: str = self.model_dir.resolve().name
        self.max_tenants = max_tenants
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if dtype == "auto":
            dtype = "bfloat16" if self.device.type == "cuda" else "float32"
        if dtype not in ("float32", "bfloat16"):
            raise EngineError(f"dtype={dtype!r}: expected float32, bfloat16 or auto")
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=getattr(torch, dtype),
                                                     local_files_only=True)
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        cfg = self.model.config
        #: the longest sequence the model takes; its architecture's name
        self.context: int = int(getattr(cfg, "max_position_embeddings", None) or 2**31 - 1)
        self.arch: str = (getattr(cfg, "architectures", None) or [cfg.model_type])[0]
        self.vocab = int(self.model.get_input_embeddings().weight.shape[0])
        self.config_sha256 = config_hash(self.model_dir)
        eos = self.model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = sorted(set(eos))
        linear = {n.rsplit(".", 1)[-1] for n, m in self.model.named_modules()
                  if isinstance(m, torch.nn.Linear)}
        out, inp = self.model.get_output_embeddings(), self.model.get_input_embeddings()
        self._unembed = out is not None and out.weight is not inp.weight and "lm_head" in linear
        self._linear = linear
        self._peft: Any = None  # the PeftModel, made with the first adapter
        self._tenants: dict[str, _Tenant] = {}
        self._samplers: dict[str, str] = {}  # name -> adapter
        self._serial = 0
        self._active: tuple[str | None, bool] | None = None

    # ---- tenants ---------------------------------------------------------------------
    def tenants(self) -> list[str]:
        return list(self._tenants)

    def create(self, tenant: str, spec: LoraSpec) -> None:
        if tenant in self._tenants:
            raise EngineError(f"tenant {tenant!r} exists")
        self._check_room()
        adapter = self._add_adapter("t", self._lora_config(spec), spec.seed or 0)
        t = _Tenant(replace(spec), adapter, self._adapter_params(adapter))
        t.reset_optimizer()
        self._tenants[tenant] = t

    def drop(self, tenant: str) -> None:
        self._delete_adapter(self._tenant(tenant).adapter)
        del self._tenants[tenant]

    def spec(self, tenant: str) -> LoraSpec:
        return replace(self._tenant(tenant).spec)

    # ---- training --------------------------------------------------------------------
    def forward_backward(self, tenant: str, data: list[Datum], loss_fn: str,
                         config: dict[str, float], forward_only: bool = False,
                         ) -> tuple[list[np.ndarray], dict[str, float]]:
        t = self._tenant(tenant)
        loss, settings = resolve(loss_fn, config or {})
        fields = ("target_tokens", *loss.inputs)
        checked = [self._check_datum(i, d, fields) for i, d in enumerate(data)]
        if not checked:
            raise EngineError("forward_backward: no data")
        self._use(t.adapter, trainable=True)
        logprobs: list[np.ndarray] = []
        total = 0.0
        for start, stop in self._micro_batches([len(tokens) for tokens, _ in checked]):
            ids, mask, inputs = self._pad(checked[start:stop])
            targets = inputs.pop("target_tokens").long()
            with torch.no_grad() if forward_only else contextlib.nullcontext():
                lp = self._logprobs(ids, mask, targets)
                terms = loss.per_token(lp, inputs, settings)
                batch_loss = torch.where(mask, terms, torch.zeros_like(terms)).sum()
            if not forward_only:
                batch_loss.backward()
            total += float(batch_loss.detach())
            rows = lp.detach().float().cpu().numpy()
            logprobs += [rows[i, :n].copy() for i, n in enumerate(mask.sum(1).tolist())]
        return logprobs, {"loss:sum": total}

    def optim_step(self, tenant: str, params: AdamParams) -> dict[str, float]:
        t = self._tenant(tenant)
        keys = list(t.params)
        norm = adamw([t.params[k] for k in keys], [t.exp_avg[k] for k in keys],
                     [t.exp_avg_sq[k] for k in keys], t.step + 1, **asdict(params))
        t.step += 1
        return {"grad_norm:mean": norm, "step:max": float(t.step)}

    # ---- checkpoints -----------------------------------------------------------------
    def save_state(self, tenant: str, directory: Path, optimizer: bool = True) -> None:
        t = self._tenant(tenant)
        meta = {"format": STATE_FORMAT, "base_model": self.base_name,
                "base_config_sha256": self.config_sha256, "spec": asdict(t.spec),
                "step": t.step, "optimizer": optimizer}

        def write(tmp: Path) -> None:
            self._write_adapter(t, tmp)
            if optimizer:
                moments = {f"exp_avg/{k}": v for k, v in t.exp_avg.items()}
                moments |= {f"exp_avg_sq/{k}": v for k, v in t.exp_avg_sq.items()}
                save_tensors(moments, tmp / OPTIMIZER_WEIGHTS)
            (tmp / STATE_JSON).write_text(json.dumps(meta, indent=1))
        write_atomically(Path(directory), write)

    def load_state(self, tenant: str, directory: Path, optimizer: bool) -> None:
        directory = Path(directory)
        meta = self._read_state_meta(directory)
        if optimizer and not meta.get("optimizer"):
            raise EngineError(f"{directory}: saved without optimizer state")
        try:
            spec, step = LoraSpec(**meta["spec"]), int(meta.get("step", 0))
            _check_rank(spec)
        except (TypeError, ValueError, KeyError) as exc:
            raise EngineError(f"{directory}: bad spec in {STATE_JSON}: {exc}") from None
        weights = load_tensors(directory / ADAPTER_WEIGHTS)
        moments = load_tensors(directory / OPTIMIZER_WEIGHTS) if optimizer else {}
        if tenant not in self._tenants:
            self._check_room()
        adapter = self._add_adapter("t", self._lora_config(spec), spec.seed or 0)
        try:
            t = _Tenant(spec, adapter, self._adapter_params(adapter))
            copy_into(t.params, weights, directory / ADAPTER_WEIGHTS)
            t.reset_optimizer()
            if optimizer:
                where = directory / OPTIMIZER_WEIGHTS
                copy_into(t.exp_avg, strip_prefix(moments, "exp_avg/"), where)
                copy_into(t.exp_avg_sq, strip_prefix(moments, "exp_avg_sq/"), where)
                t.step = step
        except BaseException:
            self._delete_adapter(adapter)
            raise
        if tenant in self._tenants:
            self._delete_adapter(self._tenants[tenant].adapter)
        self._tenants[tenant] = t

    def save_sampler(self, tenant: str, directory: Path) -> None:
        t = self._tenant(tenant)
        write_atomically(Path(directory), lambda tmp: self._write_adapter(t, tmp))

    def load_sampler(self, name: str, directory: Path) -> None:
        directory = Path(directory)
        if not (directory / ADAPTER_JSON).is_file():
            raise EngineError(f"{directory}: no {ADAPTER_JSON}, not a saved adapter")
        try:
            config = LoraConfig.from_pretrained(str(directory))
        except (ValueError, TypeError, KeyError, OSError) as exc:
            raise EngineError(f"{directory}/{ADAPTER_JSON}: {exc}") from None
        if not isinstance(config, LoraConfig):
            raise EngineError(f"{directory}: not a LoRA adapter")
        weights = load_tensors(directory / ADAPTER_WEIGHTS)
        config.inference_mode = True
        try:
            adapter = self._add_adapter("s", config, 0)
        except (ValueError, TypeError, KeyError) as exc:
            raise EngineError(f"{directory}: cannot apply to {self.base_name}: {exc}") from None
        try:
            copy_into(self._adapter_params(adapter), weights, directory / ADAPTER_WEIGHTS)
        except BaseException:
            self._delete_adapter(adapter)
            raise
        if name in self._samplers:
            self._delete_adapter(self._samplers[name])
        self._samplers[name] = adapter

    def drop_sampler(self, name: str) -> None:
        if name not in self._samplers:
            raise EngineError(f"unknown sampler {name!r}")
        self._delete_adapter(self._samplers.pop(name))

    # ---- sampling --------------------------------------------------------------------
    def sample(self, sampler: str | None, prompt: list[int], num_samples: int,
               max_tokens: int, temperature: float = 1.0, top_k: int = -1,
               top_p: float = 1.0, stop: list[int] | list[str] | None = None,
               seed: int | None = None, prompt_logprobs: bool = False,
               ) -> tuple[list[Sample], list[float | None] | None]:
        """``sampler``: a name from :meth:`load_sampler` (looked up first), a tenant
        (its current weights), or ``None`` (the base model)."""
        adapter = self._sampler_adapter(sampler)
        ids = self._check_sample(prompt, num_samples, max_tokens, top_k, top_p, "prompt")
        stop_ids, stop_texts = self._stops(stop)
        generator = generator_for(self.device, seed)
        self._use(adapter, trainable=False)
        with torch.no_grad():
            prompt_ids = torch.from_numpy(ids)[None].to(self.device)
            out = self.model(input_ids=prompt_ids, use_cache=True,
                             logits_to_keep=0 if prompt_logprobs else 1)
            prompt_lp: list[float | None] | None = None
            if prompt_logprobs:
                lp = gather_logprobs(out.logits[0, :-1].float(), prompt_ids[0, 1:])
                prompt_lp = [None, *lp.tolist()]
            cache = out.past_key_values
            cache.batch_repeat_interleave(num_samples)
            logits = out.logits[:, -1].float().expand(num_samples, -1)
            samples = [Sample([], [], "length") for _ in range(num_samples)]
            alive = list(range(num_samples))  # the rows still decoding, in the cache's order
            for step in range(max_tokens):
                token, lp = pick(logits, temperature, top_k, top_p, generator)
                keep = []
                for row, (i, tok, tok_lp) in enumerate(zip(alive, token.tolist(), lp.tolist(),
                                                           strict=True)):
                    s = samples[i]
                    s.tokens.append(tok)
                    s.logprobs.append(tok_lp)
                    if tok in stop_ids or (stop_texts and self._stopped(s.tokens, stop_texts)):
                        s.stop_reason = "stop"
                    else:
                        keep.append(row)
                if not keep or step == max_tokens - 1:
                    break
                if len(keep) < len(alive):
                    index = torch.tensor(keep, device=self.device)
                    cache.batch_select_indices(index)
                    token = token[index]
                    alive = [alive[row] for row in keep]
                out = self.model(input_ids=token[:, None], past_key_values=cache, use_cache=True)
                cache, logits = out.past_key_values, out.logits[:, -1].float()
        return samples, prompt_lp

    def sample_many(self, sampler: str | None, requests: list[SampleRequest],
                    temperature: float = 1.0, top_k: int = -1, top_p: float = 1.0,
                    stop: list[int] | list[str] | None = None) -> list[list[Sample]]:
        """Each request's samples, as :meth:`sample` would draw them alone, decoded as one
        batch (:mod:`.sampling`)."""
        adapter = self._sampler_adapter(sampler)
        for i, r in enumerate(requests):
            self._check_sample(r.prompt, r.num_samples, r.max_tokens, top_k, top_p,
                               f"request {i}")
        stop_ids, stop_texts = self._stops(stop)
        self._use(adapter, trainable=False)
        return decode(self.model, self.device, requests, temperature, top_k, top_p, stop_ids,
                      (lambda tokens: self._stopped(tokens, stop_texts)) if stop_texts else None)

    # ---- internals -------------------------------------------------------------------
    def _check_sample(self, prompt: list[int], num_samples: int, max_tokens: int,
                      top_k: int, top_p: float, where: str) -> np.ndarray:
        """A sample request's prompt as ids, or an :class:`EngineError` naming the fault."""
        ids = self._check_tokens(prompt, where)
        if len(ids) == 0:
            raise EngineError(f"{where}: empty")
        if num_samples < 1 or max_tokens < 1:
            raise EngineError(f"{where}: num_samples={num_samples}, max_tokens={max_tokens}: "
                              "both must be at least 1")
        if len(ids) + max_tokens > self.context:
            raise EngineError(f"{where}: {len(ids)} tokens + max_tokens={max_tokens} exceed "
                              f"the model's {self.context}-token context")
        if top_k == 0 or top_k < -1 or not 0 < top_p <= 1:
            raise EngineError(f"top_k={top_k}, top_p={top_p}: top_k is -1 (none) or at "
                              "least 1, top_p in (0, 1]")
        return ids

    def _tenant(self, tenant: str) -> _Tenant:
        if tenant not in self._tenants:
            raise EngineError(f"unknown tenant {tenant!r}")
        return self._tenants[tenant]

    def _check_room(self) -> None:
        if len(self._tenants) >= self.max_tenants:
            raise EngineError(f"the engine holds its maximum of {self.max_tenants} tenants")

    def _lora_config(self, spec: LoraSpec) -> LoraConfig:
        _check_rank(spec)
        wanted = ((ATTN if spec.train_attn else ()) + (MLP if spec.train_mlp else ())
                  + (("lm_head",) if spec.train_unembed and self._unembed else ()))
        targets = [name for name in wanted if name in self._linear]
        if not targets:
            raise EngineError(f"{spec}: no module of {self.base_name} to train")
        return LoraConfig(r=spec.rank, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                          target_modules=targets, bias="none", task_type="CAUSAL_LM",
                          base_model_name_or_path=str(self.model_dir))

    def _add_adapter(self, kind: str, config: LoraConfig, seed: int) -> str:
        """A new adapter (B zero: the base model's outputs), its A drawn from ``seed``
        without touching the global generator's state."""
        self._serial += 1
        adapter = f"{kind}{self._serial}"
        self._active = None  # peft re-applies the active adapter's requires_grad
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            if self._peft is None:
                self._peft = get_peft_model(self.model, config, adapter_name=adapter)
            else:
                self._peft.add_adapter(adapter, config)
        self.model.eval()  # the new adapter's modules (a loaded adapter's dropout) too
        return adapter

    def _delete_adapter(self, adapter: str) -> None:
        self._active = None
        others = [a for a in self._peft.peft_config if a != adapter]
        if others:  # peft would make one active itself, warning that it does
            self._peft.base_model.set_adapter(others[0], inference_mode=True)
        self._peft.delete_adapter(adapter)

    def _adapter_params(self, adapter: str) -> dict[str, torch.nn.Parameter]:
        """The adapter's parameters under their keys in peft's saved format."""
        out = {}
        for name, p in self._peft.named_parameters():
            for kind in ("lora_A", "lora_B"):
                tag = f".{kind}.{adapter}."
                if tag in name:
                    out[name.replace(tag, f".{kind}.")] = p
        return out

    def _use(self, adapter: str | None, trainable: bool) -> None:
        """Make ``adapter`` the one the model applies (``None``: none)."""
        if self._active == (adapter, trainable) or self._peft is None:
            return
        if self._active is None or (self._active[0] is None) != (adapter is None):
            for module in self.model.modules():
                if isinstance(module, BaseTunerLayer):
                    module.enable_adapters(adapter is not None)
        if adapter is not None:
            self._peft.base_model.set_adapter(adapter, inference_mode=not trainable)
        self._active = (adapter, trainable)

    def _sampler_adapter(self, sampler: str | None) -> str | None:
        if sampler is None:
            return None
        if sampler in self._samplers:
            return self._samplers[sampler]
        if sampler in self._tenants:
            return self._tenants[sampler].adapter
        raise EngineError(f"unknown sampler {sampler!r} (neither a loaded sampler nor a "
                          "tenant)")

    def _write_adapter(self, t: _Tenant, directory: Path) -> None:
        """peft's own on-disk format: adapter_config.json, adapter_model.safetensors."""
        config = copy.deepcopy(self._peft.peft_config[t.adapter])
        config.inference_mode = True
        config.save_pretrained(str(directory))
        save_tensors({k: p.detach() for k, p in t.params.items()}, directory / ADAPTER_WEIGHTS)

    def _read_state_meta(self, directory: Path) -> dict[str, Any]:
        try:
            meta = json.loads((directory / STATE_JSON).read_text())
        except (OSError, ValueError):
            raise EngineError(f"{directory}: not a saved training state (no readable "
                              f"{STATE_JSON})") from None
        if not isinstance(meta, dict) or meta.get("format") != STATE_FORMAT:
            raise EngineError(f"{directory}: not a saved training state ({STATE_JSON} is "
                              f"not of format {STATE_FORMAT})")
        if meta.get("base_config_sha256") != self.config_sha256:
            raise EngineError(f"{directory}: saved from another base model "
                              f"({meta.get('base_model')!r}), not {self.base_name!r}")
        return meta

    def _check_tokens(self, tokens: Any, where: str) -> np.ndarray:
        arr = np.asarray(tokens)
        if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
            raise EngineError(f"{where}: expected a list of token ids")
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab):
            raise EngineError(f"{where}: token ids must be in [0, {self.vocab})")
        return arr.astype(np.int64)

    def _check_datum(self, i: int, d: Datum, fields: tuple[str, ...],
                     ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        tokens = self._check_tokens(d.tokens, f"datum {i}: model_input")
        n = len(tokens)
        if not 0 < n <= self.context:
            raise EngineError(f"datum {i}: model_input has {n} tokens; 1..{self.context}")
        inputs = {}
        for name in fields:
            if name not in d.inputs:
                raise EngineError(f"datum {i}: loss_fn_inputs has no {name!r}")
            arr = np.asarray(d.inputs[name])
            if arr.shape != (n,):
                raise EngineError(f"datum {i}: {name} has shape {arr.shape}, model_input "
                                  f"{n} tokens")
            if name == "target_tokens":
                if arr.dtype.kind == "f" and np.all(arr == np.round(arr)):
                    arr = arr.astype(np.int64)
                arr = self._check_tokens(arr, f"datum {i}: target_tokens")
            elif arr.dtype.kind not in "iuf" or not np.all(np.isfinite(arr)):
                raise EngineError(f"datum {i}: {name} must be finite numbers")
            inputs[name] = arr
        return tokens, inputs

    def _micro_batches(self, lengths: list[int]) -> Iterator[tuple[int, int]]:
        """Consecutive ``[start, stop)`` runs of datums within the forward's limits."""
        budget = max(1, min(MICRO_TOKENS, MICRO_LOGITS // self.vocab))
        start, longest = 0, 0
        for i, n in enumerate(lengths):
            count, longest = i - start + 1, max(longest, n)
            if i > start and (count > MICRO_SEQS or count * longest > budget):
                yield start, i
                start, longest = i, n
        yield start, len(lengths)

    def _pad(self, data: list[tuple[np.ndarray, dict[str, np.ndarray]]],
             ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Right-padded ids, the mask of real tokens, and the inputs padded alike."""
        width = max(len(tokens) for tokens, _ in data)
        ids = np.zeros((len(data), width), np.int64)
        mask = np.zeros((len(data), width), bool)
        padded = {k: np.zeros((len(data), width), v.dtype) for k, v in data[0][1].items()}
        for row, (tokens, inputs) in enumerate(data):
            ids[row, :len(tokens)], mask[row, :len(tokens)] = tokens, True
            for k, v in inputs.items():
                padded[k][row, :len(v)] = v
        tensors = {k: torch.from_numpy(v if k == "target_tokens" else v.astype(np.float32))
                   for k, v in padded.items()}
        return (torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device),
                {k: v.to(self.device) for k, v in tensors.items()})

    def _logprobs(self, ids: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor,
                  ) -> torch.Tensor:
        logits = self.model(input_ids=ids, attention_mask=mask.long(), use_cache=False).logits
        return gather_logprobs(logits.float(), targets)

    def _stops(self, stop: list[int] | list[str] | None) -> tuple[set[int], list[str]]:
        if stop is None:
            return set(self.eos_ids), []
        if all(isinstance(s, str) for s in stop):
            if not all(stop):
                raise EngineError("stop: an empty stop string")
            return set(), [str(s) for s in stop]
        if all(isinstance(s, int | np.integer) for s in stop):
            return {int(s) for s in stop}, []
        raise EngineError("stop: token ids or strings, not both")

    def _stopped(self, tokens: list[int], stop_texts: list[str]) -> bool:
        """Whether the text of the generated ``tokens`` now holds a stop string: it ends in
        the last token, so decoding a tail as many tokens long as the longest stop string
        has bytes, and a few more, finds it."""
        tail = max(len(s.encode()) for s in stop_texts) + 4
        text = self.tokenizer.decode(tokens[-tail:], skip_special_tokens=False)
        return any(s in text for s in stop_texts)


def _check_rank(spec: LoraSpec) -> None:
    if not isinstance(spec.rank, int) or spec.rank < 1:
        raise EngineError(f"rank={spec.rank!r}: must be an integer of at least 1")
