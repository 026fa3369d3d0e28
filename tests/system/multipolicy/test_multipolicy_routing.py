"""Solver and verifier trajectories route to their own policy, other tokens masked."""

from __future__ import annotations

import asyncio

from omegaconf import OmegaConf

from astraflow.dataflow.client import DataflowClient
from astraflow.dataflow.server import BackgroundServer
from astraflow.dataflow.settings import DataflowSettings
from astraflow.plugins import get_registry
from astraflow.raas.engines import EnginePolicy
from astraflow.rewards.exact_match import ExactMatch
from astraflow.testing.engine import LoopThread
from astraflow.text import load_tokenizer
from astraflow.workflows.solve_verify import SolveVerifyConfig, SolveVerifyWorkflow

TOKEN = "routing-test-token"


def test_batches_hold_only_their_policys_sequences_with_foreign_tokens_masked(
        tmp_path, tiny_model_dir):
    settings = DataflowSettings(store=str(tmp_path / "store"),
                                policies={"solver": 2, "verifier": 2}, group_size=4,
                                task={"name": "arithmetic", "max_operand": 20, "ops": "+-",
                                      "num_eval": 100, "seed": 1234})
    tok = load_tokenizer(tiny_model_dir)
    entry = get_registry().get("rollout_backend", "hf")
    loop = LoopThread()
    engines = {p: entry.create(OmegaConf.structured(entry.config_cls), tiny_model_dir)
               for p in ("solver", "verifier")}
    for engine in engines.values():
        loop.run(engine.start())
    workflow = SolveVerifyWorkflow(SolveVerifyConfig(), tok, ExactMatch())
    handles = {p: EnginePolicy(p, e, {}) for p, e in engines.items()}
    try:
        with BackgroundServer(settings, TOKEN) as srv, \
                DataflowClient(srv.url, TOKEN) as client:
            client.register("raas", policies=["solver", "verifier"], capacity=8)
            leases = client.lease_tasks(max_tasks=6)
            assert len(leases) == 6

            async def rollouts():
                return await asyncio.gather(*(workflow.run(lease.task, handles, 4)
                                              for lease in leases))

            made = {"solver": 0, "verifier": 0}
            for lease, trajectories in zip(leases, loop.run(rollouts()), strict=True):
                assert client.submit(lease, trajectories)["status"] == "accepted"
                for traj in trajectories:
                    made[traj.policy] += 1
            # every attempt's first answer; balanced verdicts: as many on right answers
            # as on wrong ones, so fewer than the attempts
            assert made["solver"] >= 24 and made["verifier"] <= 24
            foreign_seen = 0
            for policy, other in (("solver", "verifier"), ("verifier", "solver")):
                if not made[policy]:
                    continue
                batch = client.get_batch(policy, made[policy], timeout=10, trainer_id=policy)
                assert batch is not None and len(batch.items) == made[policy]
                for item in batch.items:
                    traj = item.trajectory
                    assert traj.policy == policy
                    for span in traj.spans:
                        mask = traj.loss_mask[span.start:span.end]
                        assert set(mask) == {int(span.source == policy)}
                        if span.source == other:
                            foreign_seen += 1
                            assert set(traj.versions[span.start:span.end]) == {-1}
                    assert sum(traj.loss_mask) > 0
            # a retried solver sees a verdict; a verifier sees the solver's answer unless the
            # solver answered with its end token alone (then there is nothing to show)
            assert foreign_seen >= made["solver"] - 24
    finally:
        for engine in engines.values():
            loop.run(engine.shutdown())
        loop.close()
