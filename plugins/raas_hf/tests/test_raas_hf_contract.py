"""raas=hf passes the shared rollout-backend contract on CPU with a real tiny model."""

from astraflow.testing.rollout import RolloutBackendContract


class TestHFRolloutContract(RolloutBackendContract):
    backend_name = "hf"
