"""``trainer=hf`` passes the shared trainer-backend contract, in float32 and with M2PO."""

from typing import Any

import pytest
from astraflow_trainer_hf import HFConfig
from omegaconf import OmegaConf

from astraflow.testing.trainer import TrainerBackendContract


class TestHFTrainer(TrainerBackendContract):
    backend_name = "hf"


class TestHFTrainerM2POMicroBatched(TrainerBackendContract):
    """M2PO with a KL reference, accumulated over micro-batches of two sequences."""

    backend_name = "hf"

    @pytest.fixture
    def backend_config(self) -> Any:
        return OmegaConf.structured(HFConfig(loss="m2po", kl_coef=0.05, micro_batch_size=2))


class TestHFTrainerBfloat16(TrainerBackendContract):
    """bfloat16 master weights: log-probs round, checkpoints still resume bit-exactly."""

    backend_name = "hf"
    logprob_atol = 0.15

    @pytest.fixture
    def backend_config(self) -> Any:
        return OmegaConf.structured(HFConfig(dtype="bfloat16"))
