"""AstraFlow's own implementations, registered through the same hooks as any plugin."""

from astraflow import hookimpl
from astraflow.data_algorithms import DynamicSamplingConfig
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
from astraflow.workflows.agent import AgentConfig
from astraflow.workflows.single_turn import SingleTurnConfig
from astraflow.workflows.solve_select import SolveSelectConfig
from astraflow.workflows.solve_testgen import SolveTestgenConfig
from astraflow.workflows.solve_verify import SolveVerifyConfig
from astraflow.workflows.tool_use import ToolUseConfig


@hookimpl
def astraflow_register_trajectory_filters(register):
    register(
        "dynamic_sampling",
        "astraflow.data_algorithms:DynamicSampling",
        DynamicSamplingConfig,
        description="Drop groups whose rewards are all equal.",
    )


@hookimpl
def astraflow_register_tasks(register):
    register(
        "arithmetic",
        "astraflow.tasks.arithmetic:ArithmeticTasks",
        ArithmeticConfig,
        description="Small-integer arithmetic with a held-out split.",
    )
    register(
        "functions",
        "astraflow.tasks.functions:FunctionTasks",
        FunctionsConfig,
        description="Write f(x) from examples as Python; hidden tests (for reward=code).",
    )
    register("jsonl", "astraflow.tasks.files:JsonlTasks", FileTaskConfig,
             description="Rows of local JSON Lines files (task.train_files, task.eval_files).")
    register("parquet", "astraflow.tasks.columnar:ParquetTasks", ParquetTaskConfig,
             description="Rows of local Parquet files.")
    register("hf_dataset", "astraflow.tasks.columnar:HFDatasetTasks", HFDatasetTaskConfig,
             description="A dataset saved with `datasets` (save_to_disk) or local data files.")
    register("verl", "astraflow.tasks.columnar:VerlTasks", VerlTaskConfig,
             description="verl's parquet layout as it is (messages, reward_model.ground_truth).")


@hookimpl
def astraflow_register_rewards(register):
    register("exact_match", "astraflow.rewards.exact_match:ExactMatch", RewardConfig,
             description="1.0 when the completion equals the answer.")
    register("math", "astraflow.rewards.math:MathReward", MathConfig,
             description="Final answer (\\boxed{}, ####, last number) equivalent to the answer.")
    register("regex", "astraflow.rewards.regex:RegexReward", RegexConfig,
             description="The pattern's first group in the completion equals the answer.")
    register("python", "astraflow.rewards.python:PythonReward", PythonRewardConfig,
             description="A function in your own file: reward.path=FILE reward.function=NAME.")
    register("code", "astraflow.rewards.code:CodeReward", CodeRewardConfig,
             description="Runs the completion's Python against the task's test cases in a sandbox.")


@hookimpl
def astraflow_register_workflows(register):
    register(
        "single_turn",
        "astraflow.workflows.single_turn:SingleTurnWorkflow",
        SingleTurnConfig,
        description="One prompt, one completion per sample.",
    )
    register(
        "tool_use",
        "astraflow.workflows.tool_use:ToolUseWorkflow",
        ToolUseConfig,
        description="Multi-turn: the policy may call a calculator tool before answering.",
    )
    register(
        "solve_verify",
        "astraflow.workflows.solve_verify:SolveVerifyWorkflow",
        SolveVerifyConfig,
        description="Two policies: a solver answers, a verifier judges, one retry.",
    )
    register(
        "solve_select",
        "astraflow.workflows.solve_select:SolveSelectWorkflow",
        SolveSelectConfig,
        description="Two policies: a solver samples k candidates, a selector picks one.",
    )
    register(
        "solve_testgen",
        "astraflow.workflows.solve_testgen:SolveTestgenWorkflow",
        SolveTestgenConfig,
        description="Two policies: a tester writes test cases, the solver's code must "
                    "pass them.",
    )
    register(
        "agent",
        "astraflow.workflows.agent:AgentWorkflow",
        AgentConfig,
        description="Your own agent (agent.path=FILE or agent.command=CMD) through the "
                    "node's OpenAI-compatible endpoint.",
    )
