"""Each policy's advantage estimator (``policies.<name>.advantage``) at intake and at batch
serving, and a batch served again carrying the advantages it was first served with:
fetched again by a restarted trainer, after a restart of the data layer, from a store
written before batch-stage advantages existed."""

from __future__ import annotations

import sqlite3

import algo_plugins
import pytest
from dataflow_helpers import TOKEN, submit_group

from astraflow import hookimpl
from astraflow.contracts import AdvantageEstimator
from astraflow.dataflow.client import DataflowError
from astraflow.dataflow.server import BackgroundServer
from astraflow.dataflow.service import DataflowService
from astraflow.dataflow.settings import DataflowSettings
from astraflow.errors import ConfigError
from astraflow.plugins import get_plugin_manager
from astraflow.rl.advantages import EPS, group_advantages
from astraflow.types import Task


def _advantages(batch) -> dict[str, float]:
    return {i.trajectory.metadata["sample"]: i.advantage for i in batch.items}


def _submit(c, groups: dict[str, list[float]]) -> None:
    c.post_tasks([Task(t, "p") for t in groups])
    for lease in c.lease_tasks(max_tasks=len(groups)):
        submit_group(c, lease, groups[lease.task.task_id])


def test_a_policys_estimator_stamps_its_advantages(start_server, connect):
    server = start_server(policies={"policy": 2}, advantages={"policy": "rloo"},
                          group_size=4, batch_size=4)
    c = connect(server)
    c.register("raas")
    _submit(c, {"a": [1.0, 0.0, 0.0, 0.0]})
    # leave-one-out: 1 - mean(0, 0, 0) and 0 - mean(1, 0, 0)
    assert _advantages(c.get_batch("policy", 4, timeout=1)) == pytest.approx(
        {"a/0": 1.0, "a/1": -1 / 3, "a/2": -1 / 3, "a/3": -1 / 3}, rel=1e-12)


# group stage r - mean: a [0.75, -0.25, -0.25, -0.25], b [0.5, 0.5, -0.5, -0.5];
# over the batch of both, mean 0 and population std sqrt(1.75 / 8)
GROUPS = {"a": [1.0, 0.0, 0.0, 0.0], "b": [1.0, 1.0, 0.0, 0.0]}
_STD = (1.75 / 8) ** 0.5
NORMALISED = {f"{t}/{k}": (r - sum(rs) / 4) / (_STD + EPS)
              for t, rs in GROUPS.items() for k, r in enumerate(rs)}


def test_reinforce_pp_normalises_the_served_batch_and_serves_it_again_alike(
        start_server, connect):
    settings = dict(policies={"policy": 2}, advantages={"policy": "reinforce_pp"},
                    group_size=4, batch_size=8)
    server = start_server(**settings)
    c = connect(server)
    c.register("raas")
    _submit(c, GROUPS)
    first = c.get_batch("policy", 8, timeout=1)
    assert _advantages(first) == pytest.approx(NORMALISED, rel=1e-12)

    # a trainer that lost the reply, or restarted, is served the batch again
    again = c.get_batch("policy", 8, timeout=1)
    assert again.batch_id == first.batch_id and again.metadata["redelivered"]
    assert _advantages(again) == _advantages(first)

    # and so is it after the data layer restarts from its store
    server.stop()
    c = connect(start_server(**settings))
    after = c.get_batch("policy", 8, timeout=1)
    assert after.batch_id == first.batch_id
    assert _advantages(after) == _advantages(first)
    c.ack_batch(after.batch_id)


def test_a_replayed_sample_brings_its_group_advantage_to_the_next_batch(tmp_path, connect):
    """The batch stage never writes back: a sample served again in another batch is
    normalised with that batch, from the advantage its group gave it."""
    settings = DataflowSettings(store=str(tmp_path / "store"), policies={"policy": 1},
                                advantages={"policy": "reinforce_pp"}, group_size=2,
                                batch_size=4, data={"replay_newest": {"replay": 1,
                                                                      "log": str(tmp_path / "l")}})
    with BackgroundServer(settings, TOKEN, registry=algo_plugins.registry()) as server:
        c = connect(server)
        c.register("raas")
        _submit(c, {"a": [0.0, 1.0], "b": [1.0, 0.0]})
        first = c.get_batch("policy", 2, timeout=1)  # a: -0.5, 0.5 over std 0.5
        assert _advantages(first) == pytest.approx({"a/0": -0.5 / (0.5 + EPS),
                                                    "a/1": 0.5 / (0.5 + EPS)}, rel=1e-12)
        c.ack_batch(first.batch_id)
        # b/0 (+0.5) and the replayed a/1 (+0.5, not the ~1.0 it was served with): equal
        second = c.get_batch("policy", 2, timeout=1)
        assert second.metadata["replayed"] == 1
        assert _advantages(second) == {"b/0": 0.0, "a/1": 0.0}


def test_a_store_from_before_batch_stages_serves_its_batches_as_they_were(
        start_server, connect, tmp_path):
    settings = dict(policies={"policy": 2}, group_size=4, batch_size=4)
    server = start_server(**settings)
    c = connect(server)
    c.register("raas")
    _submit(c, GROUPS)
    held = c.get_batch("policy", 4, timeout=1)  # grpo, served with the stamped advantages
    server.stop()
    with sqlite3.connect(tmp_path / "store" / "dataflow.sqlite3") as conn:
        conn.execute("ALTER TABLE batches DROP COLUMN advantages")  # as the older store was

    c = connect(start_server(**settings, advantages={"policy": "reinforce_pp"}))
    again = c.get_batch("policy", 4, timeout=1)
    assert again.batch_id == held.batch_id and _advantages(again) == _advantages(held)
    c.ack_batch(again.batch_id)
    # the next batch goes through the batch stage (b was stamped by grpo at intake:
    # +-1/(0.5 + eps), already of mean 0 and std ~1)
    nxt = c.get_batch("policy", 4, timeout=1)
    assert _advantages(nxt) == pytest.approx({"b/0": 1.0, "b/1": 1.0, "b/2": -1.0,
                                              "b/3": -1.0}, rel=1e-4)


def test_an_unknown_estimator_is_refused_naming_the_installed_ones(tmp_path):
    settings = DataflowSettings(store=str(tmp_path / "store"), advantages={"policy": "rlooo"})
    with pytest.raises(ConfigError) as info:
        DataflowService(settings)
    message = str(info.value)
    assert message.startswith("policies.policy.advantage=rlooo is not installed.")
    assert "Installed options: dr_grpo, grpo, reinforce_pp, rloo." in message
    assert "Did you mean policies.policy.advantage=rloo?" in message
    assert "pip install astraflow-plugin-advantage-rlooo" in message
    with pytest.raises(ConfigError, match="advantages names 'solver', which is not a policy"):
        DataflowSettings(store=str(tmp_path / "store"), advantages={"solver": "rloo"})


class _FlakyEstimator(AdvantageEstimator):
    """Answers one advantage too few the first time it is asked, then as GRPO would."""

    calls = 0

    def group_advantages(self, rewards, *, failed, rollouts=None, rollout_rewards=None):
        type(self).calls += 1
        out = group_advantages(list(rewards), failed=list(failed))
        return out[:-1] if type(self).calls == 1 else out


class _FlakyPlugin:
    @hookimpl
    def astraflow_register_advantage_estimators(self, register):
        register("flaky", _FlakyEstimator)


def test_a_refused_submission_can_be_submitted_again(tmp_path, connect):
    """An estimator's bad answer refuses the submission with a 500 naming the estimator;
    the task is not taken as done, so the node's retry of the same lease is accepted."""
    manager = get_plugin_manager()
    manager.register(_FlakyPlugin(), name="test-flaky-estimator")
    settings = DataflowSettings(store=str(tmp_path / "store"), policies={"policy": 2},
                                advantages={"policy": "flaky"}, group_size=2, batch_size=2)
    with BackgroundServer(settings, TOKEN, registry=manager.build_registry()) as server:
        c = connect(server, retry_for=0)
        c.register("raas")
        c.post_tasks([Task("t", "p")])
        (lease,) = c.lease_tasks()
        with pytest.raises(DataflowError) as refused:
            submit_group(c, lease, [0.0, 1.0])
        assert refused.value.status == 500
        assert "advantage estimator of policy 'policy' (flaky) returned" in str(refused.value)
        assert submit_group(c, lease, [0.0, 1.0])["status"] == "accepted"
        assert c.status()["tasks"]["completed"] == 1
