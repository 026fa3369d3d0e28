"""``trainer=megatron`` passes the shared trainer-backend contract on CPU (CPU mode), in
float32, with M2PO and in bfloat16."""

from astraflow.testing.trainer import contract_suites

(TestMegatronTrainer, TestMegatronTrainerM2POMicroBatched,
 TestMegatronTrainerBfloat16) = contract_suites("megatron")
