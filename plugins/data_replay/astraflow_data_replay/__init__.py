"""Buffer replay at batch serving with a staleness bound.

Importing this module is cheap: the implementation is imported only when selected.
"""

from dataclasses import dataclass

from astraflow import hookimpl


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
    replay_ratio: float = 0.25
    selection: str = "uniform"
    max_staleness: int | None = None
    seed: int = 0


@hookimpl
def astraflow_register_batch_samplers(register):
    register(
        "replay",
        "astraflow_data_replay.replay:Replay",
        ReplayConfig,
        description="Buffer replay at batch serving with a staleness bound.",
    )
