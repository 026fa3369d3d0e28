"""A store written by an earlier release opens and the run goes on: its buffered groups,
its batch served and not acknowledged, its acknowledged batch and its counts are all
still there (tests/system/dataflow/stores/astraflow-VERSION, written by
tests/helpers/make_store_fixture.py and kept unchanged)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dataflow_helpers import group
from make_store_fixture import SETTINGS

STORES = sorted((Path(__file__).parent / "stores").iterdir())


@pytest.mark.parametrize("kept", STORES, ids=[p.name for p in STORES])
def test_a_store_of_an_earlier_release_opens_and_the_run_goes_on(kept, tmp_path,
                                                                 start_server, connect):
    store = tmp_path / "store"
    shutil.copytree(kept, store)
    server = start_server(store=str(store), **SETTINGS)
    trainer, node = connect(server), connect(server)
    before = trainer.status()["policies"]["policy"]
    # six groups of two were accepted; one batch of four trained, one served
    assert before["accepted"] == 12 and before["consumed"] == 4

    trainer.register("trainer", policies=["policy"], node_id="trainer-policy")
    again = trainer.get_batch("policy", 4, timeout=10, trainer_id="trainer-policy")
    assert again is not None and len(again.items) == 4
    assert all(item.trajectory.policy == "policy" for item in again.items)
    trainer.ack_batch(again.batch_id, wait_seconds=0.0, step_seconds=0.1)
    last = trainer.get_batch("policy", 4, timeout=10, trainer_id="trainer-policy")
    trainer.ack_batch(last.batch_id, wait_seconds=0.0, step_seconds=0.1)
    served = {i.trajectory.task_id for b in (again, last) for i in b.items}
    assert len(served) == 4  # the four groups left, each once

    # new work is leased, accepted and served from the same store
    node.register("raas")
    leases = node.lease_tasks(max_tasks=2)
    assert leases
    for lease in leases:
        node.submit(lease, group(lease.task.task_id, [0.0, 1.0]))
    fresh = trainer.get_batch("policy", 4, timeout=10, trainer_id="trainer-policy")
    assert fresh is not None and {i.trajectory.task_id for i in fresh.items} <= {
        lease.task.task_id for lease in leases}
    after = trainer.status()["policies"]["policy"]
    assert after["accepted"] == 12 + 2 * len(leases) and after["consumed"] == 12
