"""Buffer replay at batch serving with a staleness bound.

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl
from astraflow.config import setting

#: how replayed trajectories are chosen
SELECTIONS = ("latest", "uniform", "reward")


@dataclass
class ReplayConfig:
    """Settings of ``data=replay``.

    ``replay_ratio`` of each batch comes from trajectories already trained on, chosen by
    ``selection``: ``latest`` (most recently produced), ``uniform`` or ``reward``
    (highest reward first, ties in random order).
    Replayed samples obey the policy's staleness bound (checked by the data layer) and
    ``max_staleness`` here when set.
    """

    name: str = "replay"
    replay_ratio: float = setting(0.25, ge=0, lt=1,
                                  why="a batch needs at least one fresh trajectory")
    selection: str = setting("uniform", choices=SELECTIONS)
    max_staleness: int | None = setting(None, ge=0)
    seed: int = setting(0, ge=0)


@hookimpl
def astraflow_register_batch_samplers(register):
    register(
        "replay",
        "astraflow_data_replay.replay:Replay",
        ReplayConfig,
        description="Buffer replay at batch serving with a staleness bound.",
    )
