"""One tensor-parallel rank, started by ``torchrun`` from test_tensor_parallel.py.

Every rank trains on the same batch; rank 0 writes what a user would compare --
log-probs and metrics as JSON, the exported weights as safetensors -- into OUT_DIR.
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
    if torch.distributed.get_rank() == 0:
        out = Path(out_dir)
        save_file(weights, str(out / "exported.safetensors"))
        (out / "result.json").write_text(json.dumps({"metrics": metrics, "logprobs": logprobs}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]))
