"""The ranks of a trainer, driven as ``astraflow train`` drives them.

``python -m astraflow.testing.rank_worker --ranks N BACKEND MODEL_DIR OUT_DIR
SETTINGS_JSON`` imports the backend once and forks the N ranks from it, setting the
variables ``torchrun`` would (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...); under
``torchrun``, without ``--ranks``, the process is one rank. Forked, a rank starts in
milliseconds instead of importing torch, transformers and the backend (5-8 CPU-seconds
for Megatron) beside the others, and the first rank that fails ends the rest, as under
``torchrun``. A backend whose import starts a thread or an accelerator cannot be forked
safely: its ranks start under ``torchrun``. Every rank builds the backend; rank 0 reads
``OUT_DIR/batch1.json`` and ``OUT_DIR/batch2.json`` and leads the others through
:class:`astraflow.trainer.ranks.Leader` (the batches reach them as tensors). Rank 0
writes what a test compares with one process into ``OUT_DIR/result.json``:

- ``step1``/``logprobs1``: the first step on batch 1, and the log-probs after it;
- ``checkpoint``: written after step 1 by every rank;
- ``step2``: the next step, on batch 2;
- ``step2_from_single``: the step on batch 2 after loading ``OUT_DIR/single-checkpoint``
  (saved after step 1 by one process), when it exists;
- ``final``: the whole model in Hugging Face format.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import sys
import traceback
from pathlib import Path

from omegaconf import OmegaConf

from astraflow.plugins import get_registry
from astraflow.trainer.ranks import Leader, follow, init
from astraflow.types import Batch


def read_batch(path: Path) -> Batch:
    return Batch.from_dict(json.loads(path.read_text()))


def write_batch(batch: Batch, path: Path) -> None:
    path.write_text(json.dumps(batch.to_dict()))


def main(backend_name: str, model_dir: str, out_dir: str, settings: str) -> None:
    import torch

    torch.set_num_threads(1)
    out = Path(out_dir)
    entry = get_registry().get("trainer_backend", backend_name)
    config = OmegaConf.merge(OmegaConf.structured(entry.config_cls), json.loads(settings))
    ranks = init(float(config.collective_timeout))
    backend = entry.create(config, model_dir)
    if not ranks.leader:
        follow(backend, ranks)
        return
    leader = Leader(backend, ranks)
    batch1, batch2 = read_batch(out / "batch1.json"), read_batch(out / "batch2.json")
    result = {"step1": leader.train_step(batch1),
              "logprobs1": leader.compute_logprobs(batch1)}
    leader.save_checkpoint(str(out / "checkpoint"))
    result["step2"] = leader.train_step(batch2)
    if (out / "single-checkpoint").exists():
        leader.load_checkpoint(str(out / "single-checkpoint"))
        result["step2_from_single"] = leader.train_step(batch2)
    leader.save_pretrained(str(out / "final"))
    leader.stop()
    (out / "result.json").write_text(json.dumps(result))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fork_ranks(world_size: int, args: list[str]) -> int:
    """Import what every rank needs once, fork ``world_size`` ranks, and wait for them:
    0 when all end well, else the first failure's code (the others are killed then,
    since they would wait for it in a collective until their timeout)."""
    import threading

    import torch

    get_registry().get("trainer_backend", args[0]).load()  # torch, the backend
    if threading.active_count() > 1 or torch.cuda.is_initialized():
        # a fork copies one thread and no accelerator context: ranks start fresh instead
        print("rank_worker: the backend's import started a thread or an accelerator; "
              "starting the ranks under torchrun", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world_size}", "-m", "astraflow.testing.rank_worker", *args])
    env = {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    ranks: dict[int, int] = {}
    for rank in range(world_size):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            # die with the parent: a test that times out kills only the process it started
            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
            os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank))
            code = 0
            try:
                main(*args)
            except BaseException:  # said on stderr, and as the exit code
                traceback.print_exc()
                code = 1
            _exit(code)
        ranks[pid] = rank
    failed = 0
    while ranks:
        pid, status = os.wait()
        rank = ranks.pop(pid, -1)
        code = os.waitstatus_to_exitcode(status)
        if rank >= 0 and code != 0 and not failed:
            print(f"rank {rank} failed with exit code {code}; ending the other ranks",
                  file=sys.stderr)
            failed = code if code > 0 else 128 - code
            for other in ranks:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(other, signal.SIGKILL)
    return failed


def _exit(code: int) -> None:
    # the work is done and written; end without the interpreter's teardown, where
    # destroying gloo's threads with the process group aborted a rank now and then
    # ("terminate called without an active exception", exit -6) after a good run
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "--ranks":
        _exit(fork_ranks(int(sys.argv[2]), sys.argv[3:7]))
    main(*sys.argv[1:5])
    _exit(0)
