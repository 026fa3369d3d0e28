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
from typing import TYPE_CHECKING, Any

from astraflow.types import Batch, Span, TrainItem, Trajectory

if TYPE_CHECKING:
    import torch

log = logging.getLogger("astraflow.trainer")

#: the backend calls rank 0 forwards, by position in the header; 0 is "nothing to do"
CALLS = ("idle", "stop", "train_step", "export_weights", "save_checkpoint",
         "load_checkpoint", "save_pretrained", "compute_logprobs")


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

    def send(self, call: str, batch: Batch | None = None, text: str = "") -> None:
        import torch
        import torch.distributed as dist

        items = batch.items if batch is not None else []
        data = (batch.batch_id if batch is not None else text).encode()
        lengths = [len(item.trajectory.tokens) for item in items]
        header = torch.tensor([CALLS.index(call), len(items), sum(lengths), len(data)],
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
        self.send("stop")

    # -- the other ranks -------------------------------------------------------------

    def receive(self) -> tuple[str, Batch | None, str]:
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
            return CALLS[call], None, text
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
        return CALLS[call], Batch(batch_id=text, policy="", items=items), ""


def _make(backend: Any, call: str, batch: Batch | None, text: str) -> Any:
    """Call ``backend.<call>`` with the batch, or the text (a path), or nothing."""
    args = (batch,) if batch is not None else (text,) if text else ()
    return getattr(backend, call)(*args)


class Leader:
    """Rank 0's side: each backend call is broadcast to the followers, then made."""

    def __init__(self, backend: Any, ranks: Ranks | None) -> None:
        self.backend, self.ranks = backend, ranks

    def __call__(self, call: str, batch: Batch | None = None, text: str = "") -> Any:
        if self.ranks is not None:
            self.ranks.send(call, batch, text)
        return _make(self.backend, call, batch, text)

    def idle(self) -> None:
        if self.ranks is not None:
            self.ranks.send("idle")

    def stop(self) -> None:
        if self.ranks is not None:
            self.ranks.stop()


def follow(backend: Any, ranks: Ranks) -> None:
    """A follower's life: make every call rank 0 broadcasts, until it says stop."""
    log.info("trainer rank %d of %d: following rank 0", ranks.rank, ranks.world_size)
    while True:
        call, batch, text = ranks.receive()
        if call == "stop":
            return
        if call != "idle":
            _make(backend, call, batch, text)
