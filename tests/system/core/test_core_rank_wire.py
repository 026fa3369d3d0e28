"""What rank 0 of a multi-process trainer sends the other ranks of a batch is enough for
them to cut it into micro-batches as rank 0 does: tokens, masks, log-probs, advantages
and which items share a group (``micro_batch_tokens`` keeps groups whole)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch.multiprocessing as mp

from astraflow.testing.trainer import prompt_completion
from astraflow.types import Batch, TrainItem


def _batch() -> Batch:
    items = []
    for g, size in enumerate((3, 1, 4)):
        for k in range(size):
            trajectory = prompt_completion(f"task-{g}", [5, 6, 7 + g], [8] * (k + 1), 1.0)
            items.append(TrainItem(trajectory, float(k) - 1.0))
    return Batch(batch_id="b1", policy="policy", items=items)


def _rank(rank: int, port: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    from astraflow.rl.policy_gradient import spans
    from astraflow.trainer.ranks import Call, Ranks

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ranks = Ranks(rank, 2, torch.device("cpu"))
    if ranks.leader:
        ranks.send(Call.TRAIN_STEP, _batch())
    else:
        call, batch, _ = ranks.receive()
        assert batch is not None
        lengths = [len(item.trajectory.tokens) for item in batch.items]
        groups = [item.trajectory.group_id for item in batch.items]
        Path(out).write_text(json.dumps({
            "call": call.name, "batch_id": batch.batch_id,
            "tokens": [item.trajectory.tokens for item in batch.items],
            "advantages": [item.advantage for item in batch.items],
            "groups": groups, "spans": spans(lengths, groups, 64, tokens=18)}))
    dist.destroy_process_group()


def test_the_other_ranks_receive_the_batch_with_its_groups(tmp_path: Path) -> None:
    from astraflow.rl.policy_gradient import spans

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "received.json"
    mp.start_processes(_rank, args=(port, str(out)), nprocs=2, start_method="spawn")
    got = json.loads(out.read_text())
    batch = _batch()
    assert got["call"] == "TRAIN_STEP" and got["batch_id"] == "b1"
    assert got["tokens"] == [item.trajectory.tokens for item in batch.items]
    assert got["advantages"] == [item.advantage for item in batch.items]
    # the same partition into groups (named differently) and so the same cut
    want = [item.trajectory.group_id for item in batch.items]
    assert [[g == h for h in got["groups"]] for g in got["groups"]] == [
        [g == h for h in want] for g in want]
    lengths = [len(item.trajectory.tokens) for item in batch.items]
    assert [list(s) for s in spans(lengths, want, 64, tokens=18)] == got["spans"]
