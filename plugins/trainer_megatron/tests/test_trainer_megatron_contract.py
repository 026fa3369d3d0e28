"""``trainer=megatron`` passes the shared trainer-backend contract on CPU (CPU mode)."""

from typing import Any

import pytest
from astraflow_trainer_megatron import MegatronConfig
from omegaconf import OmegaConf

from astraflow.testing.trainer import TrainerBackendContract


class TestMegatronTrainer(TrainerBackendContract):
    backend_name = "megatron"


class TestMegatronTrainerM2POMicroBatched(TrainerBackendContract):
    """M2PO with a KL reference model, accumulated over micro-batches of two sequences."""

    backend_name = "megatron"

    @pytest.fixture
    def backend_config(self) -> Any:
        return OmegaConf.structured(MegatronConfig(loss="m2po", kl_coef=0.05, micro_batch_size=2))


class TestMegatronTrainerBfloat16(TrainerBackendContract):
    """bfloat16 Megatron parameters: log-probs round, checkpoints still resume bit-exactly."""

    backend_name = "megatron"
    logprob_atol = 0.15

    @pytest.fixture
    def backend_config(self) -> Any:
        return OmegaConf.structured(MegatronConfig(dtype="bfloat16"))
