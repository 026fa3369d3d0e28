"""The collaborators that own the data layer's state, and the services they share, as
the ones that act on them (leasing, intake, the batch server, the status view) are
given them: named once, built once by :class:`~astraflow.dataflow.service.DataflowService`.
"""

from __future__ import annotations

from dataclasses import dataclass

from astraflow.dataflow.algorithms import Advantages, DataAlgorithms
from astraflow.dataflow.autoscale import AutoscaleWindow
from astraflow.dataflow.ledger import Ledger
from astraflow.dataflow.nodes import Nodes
from astraflow.dataflow.overload import Overload
from astraflow.dataflow.pacing import Pacing
from astraflow.dataflow.settings import DataflowSettings
from astraflow.dataflow.signals import Signals
from astraflow.dataflow.store import Store
from astraflow.dataflow.tasks import TaskQueue
from astraflow.dataflow.timeline import Timeline
from astraflow.dataflow.versions import Versions


@dataclass(frozen=True)
class Parts:
    settings: DataflowSettings
    store: Store
    tasks: TaskQueue
    ledger: Ledger
    nodes: Nodes
    versions: Versions
    algorithms: DataAlgorithms
    advantages: Advantages
    signals: Signals
    pacing: Pacing
    timeline: Timeline
    autoscale: AutoscaleWindow
    overload: Overload
