"""``logger=compat_jsonl``: a run's named scalars as JSON Lines in its run directory."""

from dataclasses import dataclass

from astraflow import hookimpl


@dataclass
class JsonlConfig:
    """Settings of ``logger=compat_jsonl``."""

    #: relative to the run directory, or absolute
    file: str = "compat-metrics.jsonl"


@hookimpl
def astraflow_register_loggers(register):
    register("compat_jsonl", "astraflow_compat_logger.jsonl:JsonlLogger", JsonlConfig,
             description="Named scalars as JSON Lines in the run directory.")
