"""Writes the data-layer store the compatibility test of stores opens
(tests/system/dataflow/stores/astraflow-VERSION): a run caught mid-way, with groups
buffered, a batch served and not acknowledged, one acknowledged, and leases in flight.

    python tests/helpers/make_store_fixture.py   # once per release whose store is kept

A store written by a release is kept unchanged from then on: a later data layer must open
it and go on.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from dataflow_helpers import TOKEN, group  # noqa: E402

from astraflow import __version__  # noqa: E402
from astraflow.dataflow.client import DataflowClient  # noqa: E402
from astraflow.dataflow.server import BackgroundServer  # noqa: E402
from astraflow.dataflow.settings import DataflowSettings  # noqa: E402

#: the settings the store was written with (the test opens it with the same)
SETTINGS = {"task": {"name": "arithmetic", "seed": 3}, "policies": {"policy": 4},
            "group_size": 2, "batch_size": 4}


def main() -> None:
    out = HERE.parent / "system" / "dataflow" / "stores" / f"astraflow-{__version__}"
    shutil.rmtree(out, ignore_errors=True)
    server = BackgroundServer(DataflowSettings(store=str(out), **SETTINGS), TOKEN).start()
    trainer, node = DataflowClient(server.url, TOKEN), DataflowClient(server.url, TOKEN)
    try:
        trainer.register("trainer", policies=["policy"], node_id="trainer-policy")
        node.register("raas")
        leases = node.lease_tasks(max_tasks=8)
        for i, lease in enumerate(leases[:6]):
            node.submit(lease, group(lease.task.task_id, [float(i % 2), 1.0 - i % 2]))
        first = trainer.get_batch("policy", 4, timeout=5, trainer_id="trainer-policy")
        trainer.ack_batch(first.batch_id, wait_seconds=0.0, step_seconds=0.1)
        trainer.announce_version("policy", 1)
        served = trainer.get_batch("policy", 4, timeout=5, trainer_id="trainer-policy")
        print(f"wrote {out}: acknowledged {first.batch_id}, served {served.batch_id}, "
              f"{len(leases) - 6} leases in flight")
    finally:
        trainer.close()
        node.close()
        server.stop()
    (out / "url").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
