"""Several tasks' submissions in one request: each answered as if it came alone."""

from __future__ import annotations

import asyncio

import httpx
from dataflow_helpers import TOKEN, group

from astraflow.dataflow.client import AsyncDataflowClient, DataflowError
from astraflow.raas.submitter import Submitter


def test_each_submission_is_answered_alone_and_a_refused_one_refuses_no_other(
        start_server, connect):
    server = start_server(task={"name": "arithmetic"}, group_size=2)
    c = connect(server)
    c.register("raas")
    leases = c.lease_tasks(max_tasks=3)
    bodies = [c.submission(lease, group(lease.task.task_id, [0.0, 1.0])) for lease in leases]
    # the first again (a retry: a duplicate), and a lease the data layer never issued
    forged = c.submission(leases[0].task.task_id + "|99",
                          group(leases[0].task.task_id, [1.0, 1.0]))
    results = c.submit_many([*bodies, bodies[0], forged])
    assert [r["status"] for r in results[:3]] == ["accepted"] * 3
    assert results[3]["status"] == "duplicate"
    assert isinstance(results[4], DataflowError) and results[4].status == 409
    assert "never issued" in results[4].detail
    status = c.status()
    assert status["policies"]["policy"]["accepted"] == 6
    assert status["tasks"]["completed"] == 3


def test_a_malformed_many_is_refused_saying_what_is_wrong(start_server):
    server = start_server(task={"name": "arithmetic"})
    with httpx.Client(base_url=server.url,
                      headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        empty = http.post("/v1/trajectories/many", json={"submissions": []})
        assert empty.status_code == 422 and "submissions" in empty.text
        unsigned = httpx.post(server.url + "/v1/trajectories/many",
                              json={"submissions": []})
        assert unsigned.status_code == 401


def test_a_node_s_concurrent_submissions_share_requests_and_each_gets_its_leases(
        start_server, connect):
    server = start_server(task={"name": "arithmetic"}, group_size=2)
    c = connect(server)
    node = c.register("raas", capacity=64)
    leases = c.lease_tasks(max_tasks=40)
    assert len(leases) == 40

    async def main() -> tuple[list, Submitter]:
        async with AsyncDataflowClient(server.url, TOKEN) as client:
            client.node_id = node
            submitter = Submitter(client)
            answers = await asyncio.gather(*(
                submitter.submit(lease, group(lease.task.task_id, [0.0, 1.0]), lease_more=1)
                for lease in leases))
            return answers, submitter

    answers, submitter = asyncio.run(main())
    assert [a["status"] for a in answers] == ["accepted"] * 40
    # the leases that take their slots (as many as admission control allows) went to
    # one caller each
    more = [lease.lease_id for a in answers for lease in a["leases"]]
    assert more and len(set(more)) == len(more)
    # submitted at once, they went in one request
    assert submitter.submissions == 40 and submitter.requests == 1
    status = c.status()["tasks"]
    assert status["completed"] == 40 and status["in_flight"] == len(more)


def test_submissions_trickling_in_wait_a_little_for_company(start_server, connect):
    """Rollouts finishing one by one (environment latency spreads them out) would each
    cost a request; once the trainers' pace is known, a submission right behind another
    request waits a small part of a step for the next ones."""
    # batch 4 of 2-sample tasks, a 0.2 s step: 10 tasks/s to consume, so a request
    # leaves at most every 0.1 s (MAX_LINGER) while submissions trickle in
    server = start_server(task={"name": "arithmetic"}, group_size=2, batch_size=4,
                          policies={"policy": 20})
    c = connect(server)
    node = c.register("raas", capacity=64)
    for lease in c.lease_tasks(max_tasks=2):
        c.submit(lease, group(lease.task.task_id, [0.0, 1.0]))
    # leased before the trainer's pace is known (after it, admission would queue only
    # what that pace consumes while these quick rollouts come back)
    leases = c.lease_tasks(max_tasks=20)
    assert len(leases) == 20
    trainer = connect(server)
    trainer.ack_batch(trainer.get_batch("policy", 4, timeout=5).batch_id,
                      wait_seconds=0.0, step_seconds=0.2)

    async def main() -> tuple[list, Submitter]:
        async with AsyncDataflowClient(server.url, TOKEN) as client:
            client.node_id = node
            submitter = Submitter(client)
            assert submitter.linger() == 0  # the pace comes with a reply to this node
            await client.lease_tasks(node, max_tasks=1)
            assert submitter.linger() > 0

            async def finish(i: int, lease) -> dict:
                await asyncio.sleep(0.01 * i)  # one finishes every 10 ms
                return await submitter.submit(lease, group(lease.task.task_id, [0.0, 1.0]))

            answers = await asyncio.gather(*(finish(i, lease)
                                             for i, lease in enumerate(leases)))
            return answers, submitter

    answers, submitter = asyncio.run(main())
    assert [a["status"] for a in answers] == ["accepted"] * 20
    # ~0.2 s of submissions: the first at once, the rest in a request or two per 0.1 s,
    # not one each
    assert submitter.submissions == 20 and submitter.requests <= 5, submitter.requests
    assert c.status()["tasks"]["completed"] == 22
