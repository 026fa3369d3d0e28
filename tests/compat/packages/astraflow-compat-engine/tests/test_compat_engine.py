"""``raas=compat_engine`` passes AstraFlow's shared rollout-backend contract."""

from astraflow.testing.rollout import RolloutBackendContract


class TestCompatEngine(RolloutBackendContract):
    backend_name = "compat_engine"
