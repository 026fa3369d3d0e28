"""``workflow=compat_prefixed``: the single-turn workflow with a prefix before every
prompt."""

from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.config import setting


@dataclass
class PrefixedConfig:
    """Settings of ``workflow=compat_prefixed``."""

    name: str = "compat_prefixed"
    max_new_tokens: int = setting(6, ge=1)
    temperature: float = setting(1.0, ge=0)
    #: text put before every task's prompt
    prompt_prefix: str = ""


@hookimpl
def astraflow_register_workflows(register):
    register("compat_prefixed", "astraflow_compat_workflow.prefixed:PrefixedWorkflow",
             PrefixedConfig, description="One completion per sample of a prefixed prompt.")
