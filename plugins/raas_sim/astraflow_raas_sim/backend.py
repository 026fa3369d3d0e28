"""The simulated engine: token ids drawn from the vocabulary after a configured delay.

Greedy output is a function of the weights' bytes and the prompt, so a weight load
changes it and reloading the same weights restores it, as with a real model; sampled
output draws from a seeded stream. Log-probs are drawn so that they look like a
sampled token's (at most 0, rarely below log(1/vocab)) -- plausible to a trainer's
importance ratio, meaningless as a model.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import time
from pathlib import Path
from typing import Any

from astraflow.contracts import RolloutBackend
from astraflow.raas.pausable import Pausable
from astraflow.types import Generation, GenerationRequest

_CHUNK = 1 << 20


def weights_digest(directory: str | Path) -> bytes:
    """What the weights in ``directory`` are, in 32 bytes (every safetensors file)."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"raas=sim: no *.safetensors in {directory}")
    digest = hashlib.sha256()
    for path in files:
        with path.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
    return digest.digest()


class SimRolloutBackend(Pausable, RolloutBackend):
    """A simulator: its rewards carry no signal, its latency is the configured one.

    A sample's token ``k`` is due ``generation_seconds + (k + 1) * token_seconds`` after
    its call started; weights swapped under a call (partial rollouts) label the tokens
    due after the swap with the new version."""

    supports_partial_rollouts = True

    def __init__(self, config: Any, model_path: str) -> None:
        super().__init__(config, model_path)
        self._rng = random.Random(config.seed)
        self._open = asyncio.Event()
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._digest = b""
        self._vocab: list[int] = []
        #: (when, version) of each weight load, newest last
        self._loads: list[tuple[float, int]] = []

    async def start(self) -> None:
        from astraflow.text import load_tokenizer

        tokenizer_file = Path(self.model_path) / "tokenizer.json"
        if not tokenizer_file.exists():
            raise FileNotFoundError(
                f"raas=sim draws token ids from the model's tokenizer; {tokenizer_file} is "
                "missing (set model.path to a model made by astraflow.models.tiny)"
            )
        tokenizer = load_tokenizer(self.model_path)
        self._vocab = [i for i in range(tokenizer.vocab_size) if i != tokenizer.pad_token_id]
        self._digest = await asyncio.to_thread(weights_digest, self.model_path)
        self._open.set()
        self._idle.set()

    async def generate(self, request: GenerationRequest) -> list[Generation]:
        if not self._vocab:
            raise RuntimeError("SimRolloutBackend.generate called before start()")
        await self._open.wait()
        self._in_flight += 1
        self._idle.clear()
        try:
            started = time.monotonic()
            out = [self._sample(request, i) for i in range(request.n)]
            longest = max((len(g.token_ids) for g in out), default=0)
            delay = (self.config.generation_seconds + self.config.token_seconds * longest
                     + self.config.env_seconds)
            if delay > 0:
                await asyncio.sleep(delay)
            return [self._label(gen, started) for gen in out]
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self._idle.set()

    def _sample(self, request: GenerationRequest, index: int) -> Generation:
        if request.temperature <= 0:
            key = hashlib.sha256(self._digest + repr((request.prompt_ids, index)).encode())
            rng = random.Random(key.digest())
        else:
            rng = random.Random(self._rng.getrandbits(64))
        floor = -math.log(len(self._vocab))
        stops = set(request.stop_token_ids)
        ids: list[int] = []
        logprobs: list[float] = []
        finish = "length"
        for _ in range(request.max_new_tokens):
            token = rng.choice(self._vocab)
            ids.append(token)
            logprobs.append(max(-rng.expovariate(2.0), floor))
            if token in stops:
                finish = "stop"
                break
        return Generation(ids, logprobs, finish, self.version)

    def _label(self, gen: Generation, started: float) -> Generation:
        """Each token's version: the newest loaded before the token was due."""
        swaps = [(t, v) for t, v in self._loads if t > started]
        if not swaps:
            return gen
        first = self.config.generation_seconds + started
        versions = []
        for k in range(len(gen.token_ids)):
            due = first + (k + 1) * self.config.token_seconds
            versions.append(max((v for t, v in swaps if t <= due), default=gen.version))
        if len(set(versions)) == 1:  # every token came after the load
            return Generation(gen.token_ids, gen.logprobs, gen.finish_reason, versions[0])
        return Generation(gen.token_ids, gen.logprobs, gen.finish_reason, min(versions),
                          versions)

    async def load_weights(self, path: str, version: int) -> None:
        self._digest = await asyncio.to_thread(weights_digest, path)
        self.version = version
        self._loads = [*self._loads[-15:], (time.monotonic(), version)]

    async def swap_weights(self, path: str, version: int) -> None:
        """Partial rollouts: the calls under way are not waited for; their tokens due
        after this load carry ``version``."""
        await self.load_weights(path, version)

    async def shutdown(self) -> None:
        self._open.clear()
