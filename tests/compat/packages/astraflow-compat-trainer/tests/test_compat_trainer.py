"""``trainer=compat_trainer`` passes AstraFlow's shared trainer-backend contract."""

from astraflow.testing.trainer import TrainerBackendContract


class TestCompatTrainer(TrainerBackendContract):
    backend_name = "compat_trainer"
