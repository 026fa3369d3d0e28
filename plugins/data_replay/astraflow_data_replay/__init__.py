"""Buffer replay at batch serving with a staleness bound.

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class ReplayConfig:
    """Settings of ``data=replay``."""

    name: str = "replay"


@hookimpl
def astraflow_register_batch_samplers(register):
    register(
        "replay",
        "astraflow_data_replay.backend:ReplaySampler",
        ReplayConfig,
        description="Buffer replay at batch serving with a staleness bound.",
    )
