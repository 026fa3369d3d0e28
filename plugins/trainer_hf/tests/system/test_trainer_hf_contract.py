"""``trainer=hf`` passes the shared trainer-backend contract, in float32, with M2PO
and in bfloat16."""

from astraflow.testing.trainer import contract_suites

TestHFTrainer, TestHFTrainerM2POMicroBatched, TestHFTrainerBfloat16 = contract_suites(
    "hf")
