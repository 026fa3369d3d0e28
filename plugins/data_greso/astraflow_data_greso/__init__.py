"""GRESO selective rollout (before-rollout data algorithm).

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class GresoConfig:
    """Settings of ``data=greso``."""

    name: str = "greso"


@hookimpl
def astraflow_register_task_selectors(register):
    register(
        "greso",
        "astraflow_data_greso.backend:GresoSelector",
        GresoConfig,
        description="GRESO selective rollout (before-rollout data algorithm).",
    )
