"""One tensor-parallel rank, started by ``torchrun`` from test_tensor_parallel.py.

Every rank trains on the same batch, saves a checkpoint (one file per rank) and
resumes from it; rank 0 writes what a user would compare -- log-probs, metrics and
whether the resumed trainer took the same step, as JSON, the exported weights as
safetensors -- into OUT_DIR.
"""

import json
import sys
from pathlib import Path

import torch
from astraflow_trainer_megatron import MegatronConfig
from astraflow_trainer_megatron.backend import MegatronTrainerBackend
from omegaconf import OmegaConf
from safetensors.torch import save_file

from astraflow.testing.trainer import arithmetic_batch, with_behaviour_logprobs


def main(model_dir: str, out_dir: str, tensor_parallel: int, advantages: list[float]) -> None:
    torch.set_num_threads(1)
    config = OmegaConf.structured(MegatronConfig(tensor_model_parallel_size=tensor_parallel))
    backend = MegatronTrainerBackend(config, model_dir)
    batch = with_behaviour_logprobs(backend, arithmetic_batch(model_dir, advantages))
    metrics = backend.train_step(batch)
    weights = backend.export_weights()
    logprobs = backend.compute_logprobs(batch)
    out = Path(out_dir)
    backend.save_checkpoint(str(out / "checkpoint"))
    resumed = MegatronTrainerBackend(config, model_dir)
    resumed.load_checkpoint(str(out / "checkpoint"))
    resumed_metrics = resumed.train_step(batch)
    same_step = resumed_metrics == backend.train_step(batch)
    after = (resumed.export_weights(), backend.export_weights())
    same_weights = all(torch.equal(after[0][k], after[1][k]) for k in after[0])
    if torch.distributed.get_rank() == 0:
        save_file(weights, str(out / "exported.safetensors"))
        result = {
            "metrics": metrics,
            "logprobs": logprobs,
            "checkpoint_resumes_bit_exactly": same_step and same_weights,
        }
        (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]))
