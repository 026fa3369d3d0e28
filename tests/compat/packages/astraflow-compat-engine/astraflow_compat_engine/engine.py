"""``raas=compat_engine``: token-by-token sampling over the model's key-value cache."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from astraflow.contracts import RolloutBackend
from astraflow.types import Generation, GenerationRequest


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``probs`` with everything outside the smallest set of mass ``top_p`` zeroed."""
    if top_p >= 1.0:
        return probs
    ordered, order = probs.sort(dim=-1, descending=True)
    keep = ordered.cumsum(-1) - ordered < top_p
    return torch.zeros_like(probs).scatter(-1, order, ordered * keep)


class CompatEngine(RolloutBackend):
    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)
        self.model: Any = None
        # one torch thread; the lock makes requests take turns and pause wait for them
        self._worker = ThreadPoolExecutor(max_workers=1)
        self._turn = asyncio.Lock()

    async def _on_worker(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    async def start(self) -> None:
        self.model = await self._on_worker(self._load)

    def _load(self) -> Any:
        torch.set_num_threads(self.config.num_threads)
        return AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=torch.float32, local_files_only=True).eval()

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        async with self._turn:
            return await self._on_worker(self._sample, request)

    @torch.inference_mode()
    def _sample(self, req: GenerationRequest) -> list[Generation]:
        generator = torch.Generator()
        if req.seed is None:
            generator.seed()
        else:
            generator.manual_seed(req.seed)
        stops = torch.tensor(req.stop_token_ids or [-1])
        out = self.model(input_ids=torch.tensor([req.prompt_ids] * req.n), use_cache=True)
        tokens, logprobs = [], []
        done = torch.zeros(req.n, dtype=torch.bool)
        for _ in range(req.max_new_tokens):
            logits = out.logits[:, -1].float()
            if req.temperature > 0:
                logp = torch.log_softmax(logits / req.temperature, dim=-1)
                probs = _nucleus(logp.exp(), req.top_p)
                token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
            else:
                logp = torch.log_softmax(logits, dim=-1)
                token = logp.argmax(-1)
            tokens.append(token)
            logprobs.append(logp.gather(-1, token[:, None]).squeeze(-1))
            done |= torch.isin(token, stops)
            if done.all():
                break
            out = self.model(input_ids=token[:, None], past_key_values=out.past_key_values,
                             use_cache=True)
        stop_ids = set(req.stop_token_ids)
        generations = []
        for row in range(req.n):
            ids = [int(t[row]) for t in tokens]
            end = next((i + 1 for i, t in enumerate(ids) if t in stop_ids), None)
            generations.append(Generation(
                token_ids=ids[:end], logprobs=[float(lp[row]) for lp in logprobs][:end],
                finish_reason="length" if end is None else "stop", version=self.version))
        return generations

    async def load_weights(self, path: str, version: int) -> None:
        await self._on_worker(self._load_weights, path)
        self.version = version

    def _load_weights(self, path: str) -> None:
        state = load_file(os.path.join(path, "model.safetensors"))
        _, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected:
            raise ValueError(f"{path}: weights this model does not have: {unexpected[:5]}")

    async def pause(self) -> None:
        await self._turn.acquire()

    async def resume(self) -> None:
        if self._turn.locked():
            self._turn.release()

    async def shutdown(self) -> None:
        self._worker.shutdown(wait=True)
        self.model = None
