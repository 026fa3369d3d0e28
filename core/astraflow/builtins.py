"""AstraFlow's own implementations, registered through the same hooks as any plugin."""

from astraflow import hookimpl
from astraflow.data_algorithms import DynamicSamplingConfig
from astraflow.loggers.mlflow import MLflowConfig
from astraflow.loggers.tensorboard import TensorBoardConfig
from astraflow.loggers.wandb import WandbConfig
from astraflow.rewards.base import RewardConfig
from astraflow.rewards.code import CodeRewardConfig
from astraflow.rewards.math import MathConfig
from astraflow.rewards.python import PythonRewardConfig
from astraflow.rewards.regex import RegexConfig
from astraflow.tasks.arithmetic import ArithmeticConfig
from astraflow.tasks.files import (
    FileTaskConfig,
    HFDatasetTaskConfig,
    ParquetTaskConfig,
    VerlTaskConfig,
)
from astraflow.tasks.functions import FunctionsConfig
from astraflow.tasks.subset_sum import SubsetSumConfig, SubsetSumRewardConfig
from astraflow.workflows.agent import AgentConfig
from astraflow.workflows.single_turn import SingleTurnConfig
from astraflow.workflows.solve_select import SolveSelectConfig
from astraflow.workflows.solve_testgen import SolveTestgenConfig
from astraflow.workflows.solve_verify import SolveVerifyConfig
from astraflow.workflows.tool_use import ToolUseConfig

#: (name, implementation, config class, description) per group
TRAJECTORY_FILTERS = [
    ("dynamic_sampling", "astraflow.data_algorithms:DynamicSampling", DynamicSamplingConfig,
     "Drop groups whose rewards are all equal."),
]
TASKS = [
    ("arithmetic", "astraflow.tasks.arithmetic:ArithmeticTasks", ArithmeticConfig,
     "Small-integer arithmetic with a held-out split."),
    ("functions", "astraflow.tasks.functions:FunctionTasks", FunctionsConfig,
     "Write f(x) from examples as Python; hidden tests (for reward=code)."),
    ("subset_sum", "astraflow.tasks.subset_sum:SubsetSumTasks", SubsetSumConfig,
     "Pick listed numbers that add up to a target (for reward=subset_sum)."),
    ("jsonl", "astraflow.tasks.files:JsonlTasks", FileTaskConfig,
     "Rows of local JSON Lines files (task.train_files, task.eval_files)."),
    ("parquet", "astraflow.tasks.columnar:ParquetTasks", ParquetTaskConfig,
     "Rows of local Parquet files."),
    ("hf_dataset", "astraflow.tasks.columnar:HFDatasetTasks", HFDatasetTaskConfig,
     "A dataset saved with `datasets` (save_to_disk) or local data files."),
    ("verl", "astraflow.tasks.columnar:VerlTasks", VerlTaskConfig,
     "verl's parquet layout as it is (messages, reward_model.ground_truth)."),
]
REWARDS = [
    ("exact_match", "astraflow.rewards.exact_match:ExactMatch", RewardConfig,
     "1.0 when the completion equals the answer."),
    ("math", "astraflow.rewards.math:MathReward", MathConfig,
     "Final answer (\\boxed{}, ####, last number) equivalent to the answer."),
    ("regex", "astraflow.rewards.regex:RegexReward", RegexConfig,
     "The pattern's first group in the completion equals the answer."),
    ("python", "astraflow.rewards.python:PythonReward", PythonRewardConfig,
     "A function in your own file: reward.path=FILE reward.function=NAME."),
    ("subset_sum", "astraflow.tasks.subset_sum:SubsetSumReward", SubsetSumRewardConfig,
     "Listed numbers joined by + that add up to the task's target."),
    ("code", "astraflow.rewards.code:CodeReward", CodeRewardConfig,
     "Runs the completion's Python against the task's test cases in a sandbox."),
]
WORKFLOWS = [
    ("single_turn", "astraflow.workflows.single_turn:SingleTurnWorkflow", SingleTurnConfig,
     "One prompt, one completion per sample."),
    ("tool_use", "astraflow.workflows.tool_use:ToolUseWorkflow", ToolUseConfig,
     "Multi-turn: the policy may call a calculator tool before answering."),
    ("solve_verify", "astraflow.workflows.solve_verify:SolveVerifyWorkflow", SolveVerifyConfig,
     "Two policies: a solver answers, a verifier judges, one retry."),
    ("solve_select", "astraflow.workflows.solve_select:SolveSelectWorkflow", SolveSelectConfig,
     "Two policies: a solver samples k candidates, a selector picks one."),
    ("solve_testgen", "astraflow.workflows.solve_testgen:SolveTestgenWorkflow",
     SolveTestgenConfig,
     "Two policies: a tester writes test cases, the solver's code must pass them."),
    ("agent", "astraflow.workflows.agent:AgentWorkflow", AgentConfig,
     "Your own agent (agent.path=FILE or agent.command=CMD) through the node's "
     "OpenAI-compatible endpoint."),
]


LOGGERS = [
    ("tensorboard", "astraflow.loggers.tensorboard:TensorBoardLogger", TensorBoardConfig,
     "TensorBoard event files in the run directory (the default)."),
    ("wandb", "astraflow.loggers.wandb:WandbLogger", WandbConfig,
     "Weights & Biases, offline files by default (pip install 'astraflow[wandb]')."),
    ("mlflow", "astraflow.loggers.mlflow:MLflowLogger", MLflowConfig,
     "MLflow, a local store in the run directory by default "
     "(pip install 'astraflow[mlflow]')."),
]
#: selected per policy (policies.<name>.advantage), no config group
ADVANTAGE_ESTIMATORS = [
    ("grpo", "astraflow.rl.advantages:GRPO", None,
     "(r - mean) / (std + eps) over each group (the default)."),
    ("dr_grpo", "astraflow.rl.advantages:DrGRPO", None,
     "r - mean over each group: GRPO without the division by the std (Dr. GRPO)."),
    ("rloo", "astraflow.rl.advantages:RLOO", None,
     "r_i - mean of the group's other rewards (leave-one-out baseline)."),
    ("reinforce_pp", "astraflow.rl.advantages:ReinforcePlusPlus", None,
     "REINFORCE++ with baseline: r - group mean, normalised over each served batch."),
]


def _register_all(register, table) -> None:
    for name, target, config_cls, description in table:
        register(name, target, config_cls, description=description)


@hookimpl
def astraflow_register_trajectory_filters(register):
    _register_all(register, TRAJECTORY_FILTERS)


@hookimpl
def astraflow_register_tasks(register):
    _register_all(register, TASKS)


@hookimpl
def astraflow_register_rewards(register):
    _register_all(register, REWARDS)


@hookimpl
def astraflow_register_workflows(register):
    _register_all(register, WORKFLOWS)


@hookimpl
def astraflow_register_loggers(register):
    _register_all(register, LOGGERS)


@hookimpl
def astraflow_register_advantage_estimators(register):
    _register_all(register, ADVANTAGE_ESTIMATORS)
