"""One rank of a trainer under ``torchrun``, driven as ``astraflow train`` drives it.

``python -m torch.distributed.run --nproc-per-node N -m astraflow.testing.rank_worker
BACKEND MODEL_DIR OUT_DIR SETTINGS_JSON`` builds the backend on every rank; rank 0 reads
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

import json
import os
import sys
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
    call = Leader(backend, ranks)
    batch1, batch2 = read_batch(out / "batch1.json"), read_batch(out / "batch2.json")
    result = {"step1": call("train_step", batch1),
              "logprobs1": call("compute_logprobs", batch1)}
    call("save_checkpoint", text=str(out / "checkpoint"))
    result["step2"] = call("train_step", batch2)
    if (out / "single-checkpoint").exists():
        call("load_checkpoint", text=str(out / "single-checkpoint"))
        result["step2_from_single"] = call("train_step", batch2)
    call("save_pretrained", text=str(out / "final"))
    call.stop()
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:5])
    # the work is done and written; end without the interpreter's teardown, where
    # destroying gloo's threads with the process group aborted a rank now and then
    # ("terminate called without an active exception", exit -6) after a good run
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
