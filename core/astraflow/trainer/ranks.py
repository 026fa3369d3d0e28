"""A trainer over several processes: rank 0 leads, the other ranks follow.

Under ``torchrun`` every rank builds the same backend. Rank 0 alone talks to the data
layer (pull, acknowledge, heartbeat, publish); before each backend call it makes, it
broadcasts the call -- and for a train step the whole batch, as tensors -- so every
rank makes the same call at the same time. A backend takes its data-parallel share of
the batch itself (tensor-parallel ranks of one replica take the same share), and its
collectives (FSDP's gathers, Megatron's reductions) meet because every rank is in the
same call. Nothing is pickled: a call is an int64 header, the batch is token, mask,
log-prob and advantage tensors, a path or batch id is UTF-8 bytes.

Every collective, the broadcasts included, gives up after ``trainer.collective_timeout``
seconds, and rank 0 broadcasts ``idle`` whenever it waited for a batch in vain, so a
follower waits at most one long-poll for its next call. A dead rank makes ``torchrun``
end the others, and the launcher restarts the trainer from its last checkpoint.

torch is imported when a call needs it, so the core still imports without torch.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

from astraflow.contracts.trainer import TrainerBackend
from astraflow.types import Batch, Span, TrainItem, Trajectory

if TYPE_CHECKING:
    import torch

log = logging.getLogger("astraflow.trainer")


class Call(IntEnum):
    """The backend calls rank 0 forwards, as the header's first number."""

    IDLE = 0  # nothing to do: rank 0 waited for a batch in vain
    STOP = 1
    TRAIN_STEP = 2
    EXPORT_WEIGHTS = 3
    SAVE_CHECKPOINT = 4
    LOAD_CHECKPOINT = 5
    SAVE_PRETRAINED = 6
    COMPUTE_LOGPROBS = 7


def _leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def init(timeout: float) -> Ranks:
    """Join the process group ``torchrun`` describes (NCCL with CUDA, else gloo)."""
    import torch
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo",
                                timeout=datetime.timedelta(seconds=timeout))
        # a process group still alive when the interpreter exits has its backend's
        # threads destroyed running: the rank aborts ("terminate called without an
        # active exception") and torchrun reports a finished trainer as failed
        atexit.register(_leave)
    return Ranks(dist.get_rank(), dist.get_world_size(),
                 torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu"))


@dataclass
class Ranks:
    rank: int
    world_size: int
    device: torch.device

    @property
    def leader(self) -> bool:
        return self.rank == 0

    # -- rank 0 --------------------------------------------------------------------

    def send(self, call: Call, batch: Batch | None = None, text: str = "") -> None:
        import torch
        import torch.distributed as dist

        items = batch.items if batch is not None else []
        data = (batch.batch_id if batch is not None else text).encode()
        lengths = [len(item.trajectory.tokens) for item in items]
        header = torch.tensor([int(call), len(items), sum(lengths), len(data)],
                              dtype=torch.int64, device=self.device)
        dist.broadcast(header, 0)
        if data:
            dist.broadcast(torch.tensor(list(data), dtype=torch.uint8, device=self.device), 0)
        if items:
            flat = [x for item in items for x in item.trajectory.tokens]
            mask = [x for item in items for x in item.trajectory.loss_mask]
            logp = [x for item in items for x in item.trajectory.logprobs]
            # each item's group, as the index of its first appearance: every rank cuts
            # micro-batches alike (micro_batch_tokens keeps groups whole)
            index: dict[str, int] = {}
            groups = [index.setdefault(item.trajectory.group_id, len(index)) for item in items]
            for values, dtype in ((lengths, torch.int64), (flat, torch.int64),
                                  (mask, torch.int64), (logp, torch.float64),
                                  ([item.advantage for item in items], torch.float64),
                                  (groups, torch.int64)):
                dist.broadcast(torch.tensor(values, dtype=dtype, device=self.device), 0)

    def stop(self) -> None:
        self.send(Call.STOP)

    # -- the other ranks -------------------------------------------------------------

    def receive(self) -> tuple[Call, Batch | None, str]:
        import torch
        import torch.distributed as dist

        header = torch.empty(4, dtype=torch.int64, device=self.device)
        dist.broadcast(header, 0)
        call, n_items, n_tokens, n_bytes = (int(x) for x in header.tolist())
        text = ""
        if n_bytes:
            raw = torch.empty(n_bytes, dtype=torch.uint8, device=self.device)
            dist.broadcast(raw, 0)
            text = bytes(raw.tolist()).decode()
        if not n_items:
            return Call(call), None, text
        parts = []
        for n, dtype in ((n_items, torch.int64), (n_tokens, torch.int64),
                         (n_tokens, torch.int64), (n_tokens, torch.float64),
                         (n_items, torch.float64), (n_items, torch.int64)):
            part = torch.empty(n, dtype=dtype, device=self.device)
            dist.broadcast(part, 0)
            parts.append(part.tolist())
        lengths, flat, mask, logp, advantages, groups = parts
        items, start = [], 0
        for n, advantage, group in zip(lengths, advantages, groups, strict=True):
            end = start + n
            trajectory = Trajectory(
                task_id="", group_id=f"g{group}", policy="", tokens=flat[start:end],
                logprobs=logp[start:end], loss_mask=mask[start:end], versions=[0] * n,
                spans=[Span(0, n, "policy")], reward=0.0)
            items.append(TrainItem(trajectory, advantage))
            start = end
        return Call(call), Batch(batch_id=text, policy="", items=items), ""


def _make(backend: TrainerBackend, call: Call, batch: Batch | None, text: str) -> None:
    """Make the call rank 0 broadcast on this rank's backend."""
    if call is Call.TRAIN_STEP and batch is not None:
        backend.train_step(batch)
    elif call is Call.COMPUTE_LOGPROBS and batch is not None:
        backend.compute_logprobs(batch)
    elif call is Call.EXPORT_WEIGHTS:
        backend.export_weights()
    elif call is Call.SAVE_CHECKPOINT:
        backend.save_checkpoint(text)
    elif call is Call.LOAD_CHECKPOINT:
        backend.load_checkpoint(text)
    elif call is Call.SAVE_PRETRAINED:
        backend.save_pretrained(text)


class Leader:
    """Rank 0's side of the backend contract: each call is broadcast to the other ranks,
    then made on this rank's backend. Alone (``ranks`` None) it is the backend's own."""

    def __init__(self, backend: TrainerBackend, ranks: Ranks | None) -> None:
        self.backend, self.ranks = backend, ranks

    def _send(self, call: Call, batch: Batch | None = None, text: str = "") -> None:
        if self.ranks is not None:
            self.ranks.send(call, batch, text)

    def train_step(self, batch: Batch) -> dict[str, float]:
        self._send(Call.TRAIN_STEP, batch)
        return self.backend.train_step(batch)

    def compute_logprobs(self, batch: Batch) -> list[list[float]]:
        self._send(Call.COMPUTE_LOGPROBS, batch)
        return self.backend.compute_logprobs(batch)

    def adapter_config(self) -> dict[str, Any] | None:
        return self.backend.adapter_config()  # rank 0's own: nothing to make elsewhere

    def export_weights(self) -> dict[str, Any]:
        self._send(Call.EXPORT_WEIGHTS)
        return self.backend.export_weights()

    def save_checkpoint(self, path: str) -> None:
        self._send(Call.SAVE_CHECKPOINT, text=path)
        self.backend.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> None:
        self._send(Call.LOAD_CHECKPOINT, text=path)
        self.backend.load_checkpoint(path)

    def save_pretrained(self, path: str) -> None:
        self._send(Call.SAVE_PRETRAINED, text=path)
        self.backend.save_pretrained(path)

    def idle(self) -> None:
        self._send(Call.IDLE)

    def stop(self) -> None:
        self._send(Call.STOP)


def follow(backend: TrainerBackend, ranks: Ranks) -> None:
    """A follower's life: make every call rank 0 broadcasts, until it says stop."""
    log.info("trainer rank %d of %d: following rank 0", ranks.rank, ranks.world_size)
    while True:
        call, batch, text = ranks.receive()
        if call is Call.STOP:
            return
        _make(backend, call, batch, text)
