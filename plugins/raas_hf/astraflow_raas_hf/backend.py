"""Batched generation with transformers, returning per-token behaviour log-probs.

Concurrent ``generate`` calls are queued and served together: whatever arrived while a
batch was running forms the next batch (continuous batching at request granularity).
All torch work runs on one worker thread, so weight loads never race generation.

LoRA adapters are served with ``peft``, unmerged: the base model is wrapped once, each
policy's adapter sits beside it under the policy's name, and a new version overwrites
that adapter's few tensors in place. Merging instead would rewrite every adapted base
weight on each version and could serve only one policy per copy of the base; the
unmerged adapter costs two thin matmuls per adapted layer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LogitsProcessor, LogitsProcessorList

from astraflow.contracts import RolloutBackend
from astraflow.models import hf_layout
from astraflow.models.checkpoint import served_dtype
from astraflow.models.router_replay import Recorder
from astraflow.raas.pausable import Pausable
from astraflow.routing import from_array
from astraflow.types import Generation, GenerationRequest, RoutedExperts
from astraflow_raas_hf import check_config, streaming
from astraflow_raas_hf.batching import chunks
from astraflow_raas_hf.prefix_cache import PrefixCache

#: ``raas.dtype`` as resolved (``auto``: the checkpoint's own, which may be float16)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class _Pending:
    request: GenerationRequest
    future: asyncio.Future = field(repr=False)


@dataclass
class _Swap:
    """Weights to load under the generations in flight, at their next decode step."""

    path: str
    version: int
    done: concurrent.futures.Future = field(repr=False)


class _SwapAtStep(LogitsProcessor):
    """Runs between two decode steps of ``generate``: the scores of token ``step`` were
    computed on the weights held until now, so a swap made here samples tokens from
    ``step + 1`` on with the new ones (on the keys and values cached so far)."""

    def __init__(self, backend: HFRolloutBackend, width: int) -> None:
        self.backend, self.width = backend, width

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        self.backend.decode_steps += 1
        if self.backend._swap is not None:
            self.backend._apply_swap(input_ids.shape[1] - self.width + 1)
        return scores


def tied_names(model: torch.nn.Module) -> set[str]:
    """Tensors that share storage with one named before them (tied embeddings): a
    checkpoint stores them once."""
    seen, tied = set(), set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            tied.add(name)
        seen.add(tensor.data_ptr())
    return tied


class HFRolloutBackend(Pausable, RolloutBackend):
    supports_adapters = True
    supports_expert_adapters = True
    supports_partial_rollouts = True
    supports_router_replay = True

    @classmethod
    def check_config(cls, config: Any) -> None:
        check_config(config)

    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task | None = None
        self._open = asyncio.Event()
        self._idle = asyncio.Event()
        self.model: Any = None  # the transformers model, once started
        self._tied: set[str] = set()
        self._adapter_configs: dict[str, dict] = {}
        #: weights waiting for the next decode step, and the (first token, version)
        #: switches of the generation under way
        self._swap: _Swap | None = None
        #: decode steps taken so far (a test knows from it that a generation is under way)
        self.decode_steps = 0
        self._swap_lock = threading.Lock()
        self._switches: list[tuple[int, int]] = []
        #: router replay: records the experts every MoE layer routed each position to
        self._record_routing = False
        self._recorder: Recorder | None = None
        #: long prompts' KV caches, for the next turn of the same conversation
        budget = int(float(getattr(config, "prefix_cache_gib", 0.0)) * (1 << 30))
        self.prefixes = PrefixCache(budget, int(getattr(config, "prefix_cache_min_tokens",
                                                        1024))) if budget > 0 else None

    def record_routing(self) -> None:
        self._record_routing = True

    def configure_adapters(self, max_rank: int, names: list[str]) -> None:
        try:
            import peft  # noqa: F401
        except ImportError:
            raise ImportError("serving LoRA adapters with raas=hf needs peft: pip install "
                              "'astraflow-plugin-raas-hf[lora]'") from None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.model = await loop.run_in_executor(self._executor, self._load)
        self._tied = tied_names(self.model)
        if self._record_routing:
            self._recorder = Recorder(self.model)
            if not self._recorder.routers:
                raise ValueError(f"trainer.router_replay=true: {self.model_path} has no "
                                 "mixture-of-experts router to record")
        self._queue = asyncio.Queue()
        self._open.set()
        self._idle.set()
        self._worker = asyncio.create_task(self._serve())

    def _load(self) -> Any:
        torch.set_num_threads(self.config.num_threads)
        device = self.config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = DTYPES[served_dtype(self.config.dtype, self.model_path)]
        model = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=dtype, local_files_only=True
        )
        return model.to(device).eval()

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        if self._queue is None:
            raise RuntimeError("HFRolloutBackend.generate called before start()")
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(request, future))
        return await future

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            await self._open.wait()
            batch = [first]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            # a caller that gave up meanwhile (an over-provisioned group's sample that
            # was cancelled) is not generated for
            batch = [pending for pending in batch if not pending.future.done()]
            if not batch:
                continue
            self._idle.clear()
            try:
                results = await loop.run_in_executor(
                    self._executor, self._generate_batch, [p.request for p in batch]
                )
                for pending, result in zip(batch, results, strict=True):
                    if not pending.future.done():
                        pending.future.set_result(result)
            except Exception as exc:  # a failed batch fails its callers, not the engine
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(exc)
            finally:
                self._idle.set()

    def _generate_batch(self, requests: list[GenerationRequest]) -> list[list[Generation]]:
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, req in enumerate(requests):
            groups[(req.temperature, req.top_p, tuple(req.stop_token_ids),
                    req.adapter)].append(i)
        out: list[list[Generation]] = [[] for _ in requests]
        for indices in groups.values():
            rows = [i for i in indices for _ in range(requests[i].n)]
            for chunk in self._chunks(rows, requests):
                gens = self._generate_rows([requests[i] for i in chunk])
                for i, gen in zip(chunk, gens, strict=True):
                    out[i].append(gen)
        return out

    def _chunks(self, rows: list[int], requests: list[GenerationRequest]) -> list[list[int]]:
        """``rows`` (request indices) cut into forward passes (:func:`.batching.chunks`)."""
        cut = chunks([len(requests[i].prompt_ids) for i in rows],
                     max(1, self.config.max_batch_size),
                     int(getattr(self.config, "max_batch_tokens", 1 << 62)))
        return [[rows[k] for k in chunk] for chunk in cut]

    @torch.inference_mode()
    def _generate_rows(self, rows: list[GenerationRequest]) -> list[Generation]:
        first = rows[0]
        with self._adapter(first.adapter):
            return self._sample(rows)

    @contextlib.contextmanager
    def _adapter(self, name: str | None):
        """Generate with adapter ``name``; one not loaded yet is its version 0, the base."""
        if name is None or name not in self._adapter_configs:
            if hasattr(self.model, "disable_adapter"):
                with self.model.disable_adapter():
                    yield
                return
            yield
            return
        self.model.set_adapter(name)
        yield

    def _sample(self, rows: list[GenerationRequest]) -> list[Generation]:
        first = rows[0]
        if first.adapter is None:
            self._apply_swap()  # weights that arrived between two generations: all new
        model = self.model
        version = self.adapter_versions.get(first.adapter, 0) if first.adapter else self.version
        if first.seed is not None:
            torch.manual_seed(first.seed)
        pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
        width = max(len(r.prompt_ids) for r in rows)
        # left padding keeps the new tokens aligned; built as lists, one tensor each
        # (a tensor a row cost microseconds a row, on the node's busiest thread)
        input_ids = torch.tensor([[pad] * (width - len(r.prompt_ids)) + list(r.prompt_ids)
                                  for r in rows], dtype=torch.long)
        attention = torch.tensor([[0] * (width - len(r.prompt_ids)) + [1] * len(r.prompt_ids)
                                  for r in rows], dtype=torch.long)
        greedy = first.temperature <= 0
        stop = list(first.stop_token_ids)
        self._switches = []
        # whole-weight swaps happen between decode steps; an adapter's load waits instead
        swaps = [] if first.adapter else [_SwapAtStep(self, width)]
        recorder = self._recorder
        # recorded routing covers every position of every row: no shared prefill pass
        cache = None if recorder else self._prefill(model, rows, input_ids, attention)
        # one conversation's next turn: its earlier turn's keys and values, if kept
        reuse = (cache is None and recorder is None and len(rows) == 1
                 and first.adapter is None and self.prefixes is not None)
        if reuse:
            assert self.prefixes is not None
            hit = self.prefixes.take(first.prompt_ids, version)
            cache = None if hit is None else hit[1]
        recording = recorder.recording() if recorder else contextlib.nullcontext()
        with recording:
            generated = self._run_generate(model, cache, swaps, input_ids, attention, rows,
                                           greedy, stop, pad)
        if reuse and not self._switches and generated.past_key_values is not None:
            assert self.prefixes is not None
            kept = generated.past_key_values
            self.prefixes.put(tuple(generated.sequences[0, :kept.get_seq_length()].tolist()),
                              kept, version)
        routed = self._routed(recorder, rows, width) if recorder else None
        new_tokens = generated.sequences[:, width:]
        logits = torch.stack(generated.logits, dim=1).float()
        if not greedy:
            logits = logits / first.temperature
        logprobs = torch.log_softmax(logits, dim=-1)
        chosen = logprobs.gather(-1, new_tokens.unsqueeze(-1)).squeeze(-1).tolist()
        all_ids = new_tokens.tolist()
        out = []
        for row, req in enumerate(rows):
            ids = all_ids[row][: req.max_new_tokens]
            reason = "length"
            for pos, tok in enumerate(ids):
                if tok in stop:
                    ids, reason = ids[: pos + 1], "stop"
                    break
            versions = None
            if self._switches:
                versions = [version] * len(ids)
                for start, new in self._switches:
                    versions[start:] = [new] * max(0, len(ids) - start)
            out.append(Generation(ids, chosen[row][: len(ids)], reason, version,
                                  versions, None if routed is None else routed(row, len(ids))))
        return out

    def _run_generate(self, model: Any, cache: Any, swaps: list, input_ids: torch.Tensor,
                      attention: torch.Tensor, rows: list[GenerationRequest], greedy: bool,
                      stop: list[int], pad: int) -> Any:
        first = rows[0]
        return model.generate(
            past_key_values=cache,
            logits_processor=LogitsProcessorList(swaps),
            input_ids=input_ids.to(model.device),
            attention_mask=attention.to(model.device),
            do_sample=not greedy,
            temperature=None if greedy else first.temperature,
            top_p=None if greedy else first.top_p,
            top_k=None,
            max_new_tokens=max(r.max_new_tokens for r in rows),
            eos_token_id=stop or None,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )

    @staticmethod
    def _routed(recorder: Recorder, rows: list[GenerationRequest], width: int) -> Any:
        """``routed(row, tokens)``: the row's routed experts over its prompt and its
        ``tokens`` generated tokens. ``generate``'s first call ran the left-padded
        prompts, each later call one token a row; the last token was never run."""
        prompt = recorder.stacked(0, (len(rows), width))  # [rows, width, layers, k]
        steps = [recorder.stacked(c, (len(rows), 1)) for c in range(1, len(recorder.calls))]
        later = torch.cat(steps, dim=1) if steps else prompt[:, :0]

        def routed(row: int, tokens: int) -> RoutedExperts:
            length = len(rows[row].prompt_ids)
            parts = [prompt[row, width - length:], later[row, :tokens]]
            missing = tokens - later.shape[1]
            if missing > 0:  # the tokens no call ran
                parts.append(torch.full((missing, *prompt.shape[2:]), -1, dtype=torch.int64))
            return from_array(torch.cat(parts).numpy(), getattr(
                recorder.routers[0], "num_experts", None))

        return routed

    def _prefill(self, model: Any, rows: list[GenerationRequest], input_ids: torch.Tensor,
                 attention: torch.Tensor) -> Any:
        """The KV cache of every row's prompt but its last token, computed once per
        distinct prompt and copied to the rows that share it; None when no two rows
        share one (``generate`` prefills as usual). ``generate`` then runs the last
        prompt token of each row on it, which gives the first sampled token's logits."""
        if not getattr(self.config, "shared_prefix", True) or input_ids.shape[1] < 2:
            return None
        distinct: dict[tuple[int, ...], int] = {}  # prompt -> its first row
        owner = [distinct.setdefault(tuple(r.prompt_ids), i) for i, r in enumerate(rows)]
        if len(distinct) == len(rows):
            return None
        firsts = list(distinct.values())
        place = {row: n for n, row in enumerate(firsts)}
        ids = input_ids[firsts, :-1].to(model.device)
        mask = attention[firsts, :-1].to(model.device)
        # the positions generate gives a left-padded row: count its real tokens
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
        cache = model(input_ids=ids, attention_mask=mask, position_ids=positions,
                      use_cache=True).past_key_values
        cache.batch_select_indices(torch.tensor([place[o] for o in owner],
                                                device=model.device))
        return cache

    async def swap_weights(self, path: str, version: int) -> None:
        """Partial rollouts: the generation under way takes the new weights at its next
        decode step (an idle engine loads them at once); tokens keep their versions."""
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._swap_lock:
            if self._swap is not None:
                raise RuntimeError("swap_weights while another swap waits")
            self._swap = _Swap(path, version, done)
        asyncio.get_running_loop().run_in_executor(self._executor, self._apply_swap)
        await asyncio.wrap_future(done)

    def _apply_swap(self, first_token: int | None = None) -> None:
        """On the engine's thread: load the waiting weights, if any; during a generation
        its tokens from ``first_token`` on are the new version's."""
        with self._swap_lock:
            swap, self._swap = self._swap, None
        if swap is None:
            return
        try:
            with torch.inference_mode(False), torch.no_grad():
                self._load_weights(swap.path)
        except Exception as exc:
            swap.done.set_exception(exc)
            return
        self.version = swap.version
        if first_token is not None:
            self._switches.append((first_token, swap.version))
        swap.done.set_result(None)

    async def load_weights(self, path: str, version: int) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._load_weights, path)
        self.version = version

    def _load_weights(self, path: str) -> None:
        """On the engine's thread (no generation runs meanwhile): the weights at ``path``
        into the model in place, a tensor at a time; nothing is written unless every
        name and shape fits."""
        file = path if path.endswith(".safetensors") else os.path.join(path, "model.safetensors")
        with torch.no_grad():
            if not hf_layout.converts(self.model):  # held under the checkpoint's names
                streaming.load_into(self.model, file, self._tied, path)
                return
            # held in another layout (fused experts): one model tensor may take several
            # of the file's, so the whole file is converted at once
            state = hf_layout.to_model(self.model, load_file(file))
            targets = self.model.state_dict()
            streaming.check_fit(path, {k: v.shape for k, v in state.items()}, targets,
                                self._tied)
            for name in list(state):  # each freed once copied: no second whole copy
                targets[name].copy_(state.pop(name))

    async def load_adapter(self, name: str, path: str, version: int) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._load_adapter, name, path)
        self.adapter_versions[name] = version

    def _load_adapter(self, name: str, path: str) -> None:
        import json
        from pathlib import Path

        from peft import PeftModel, set_peft_model_state_dict

        config = json.loads((Path(path) / "adapter_config.json").read_text())
        if name in self._adapter_configs and self._adapter_configs[name] != config:
            self.model.delete_adapter(name)  # another rank or targets: load it afresh
            del self._adapter_configs[name]
        if name in self._adapter_configs:  # a new version: overwrite its tensors in place
            state = load_file(os.path.join(path, "adapter_model.safetensors"))
            result = set_peft_model_state_dict(self.model, state, adapter_name=name)
            if result.unexpected_keys:
                raise ValueError(f"adapter at {path} does not fit {name}'s: unexpected "
                                 f"{result.unexpected_keys[:5]}")
        elif isinstance(self.model, PeftModel):
            self.model.load_adapter(path, adapter_name=name)
        else:
            self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name)
        self.model.eval()
        self._adapter_configs[name] = config

    async def shutdown(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._executor.shutdown(wait=True)
        self.model = None
