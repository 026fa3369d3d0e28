"""The node's OpenAI-compatible endpoint, called with the real ``openai`` client.

What a trajectory trains must be exactly what the engine sampled: the same ids, the
same log-probs, in the same order, with everything else (prompts, tool results) as
context only -- however the agent sends its history back.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from astraflow.types import Task

CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}


def calculator(expression: str) -> str:
    a, b = expression.split("+")
    return str(int(a) + int(b))


def tool_rollout(client, question: str, follow_up: str) -> list[dict]:
    """An agent as written for the OpenAI API: ask, run the tool calls, ask again."""
    messages = [{"role": "user", "content": question}]
    for turn in range(3):
        if turn == 2:
            messages.append({"role": "user", "content": follow_up})
        reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALC],
                                               temperature=0, max_tokens=12, logprobs=True)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculator(args["expression"])})
    return messages


def test_a_three_turn_tool_rollout_trains_exactly_the_sampled_tokens(node):
    spy = node.spies["policy"]
    spy.sampled.clear()
    session = node.open(Task("t1", "3+4=", "7"), ["policy"])
    messages = tool_rollout(node.client(session), "3+4=", "5+2=")
    node.gateway.close(session.key)
    # the model called the calculator and answered with its result
    assert messages[1]["tool_calls"][0]["function"]["name"] == "calc"
    assert messages[2] == {"role": "tool", "tool_call_id": messages[1]["tool_calls"][0]["id"],
                           "content": "7"}
    assert messages[3]["content"] == "7"
    assert session.calls == 3 and session.restarts == 0
    (traj,) = session.trajectories(1.0, {})
    traj.validate()
    sampled = [g for g in spy.sampled]
    assert len(sampled) == 3
    trained = [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m]
    trained_lp = [lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m]
    assert trained == [t for g in sampled for t in g.token_ids]
    assert trained_lp == [lp for g in sampled for lp in g.logprobs]  # bit-identical
    assert [v for v, m in zip(traj.versions, traj.loss_mask, strict=True) if m] == \
        [g.version for g in sampled for _ in g.token_ids]
    # the tool's result and the user's follow-up are context, never trained
    tok = node.tokenizer
    text = "".join(tok.decode([t], skip_special_tokens=False) for t in traj.tokens)
    masked = "".join(tok.decode([t], skip_special_tokens=False)
                     for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if not m)
    assert text.startswith("3+4=calc(3+4)=7,7<eos>5+2=")
    assert masked.startswith("3+4==7,5+2=")


def test_the_behaviour_log_probs_are_the_trainers(node):
    from astraflow.testing.rollout import trainer_gap
    from astraflow.types import TrainItem

    session = node.open(Task("t2", "6+2=", "8"), ["policy"])
    tool_rollout(node.client(session), "6+2=", "1+1=")
    node.gateway.close(session.key)
    items = [TrainItem(t, 0.0) for t in session.trajectories(1.0, {})]
    worst, count = trainer_gap("hf", node.model_dir, items)
    assert count >= 6
    assert worst < 1e-4


def test_a_rewritten_history_starts_a_new_segment_and_is_counted(node):
    session = node.open(Task("t3", "2+2=", "4"), ["policy"])
    client = node.client(session)
    first = client.chat.completions.create(model="policy", temperature=0, max_tokens=6,
                                           messages=[{"role": "user", "content": "2+2="}])
    # the agent drops the history and asks something else
    client.chat.completions.create(model="policy", temperature=0, max_tokens=6,
                                   messages=[{"role": "user", "content": "9+1="}])
    node.gateway.close(session.key)
    assert first.choices[0].message.content is not None
    assert session.restarts == 1 and len(session.trajectories(0.0, {})) == 2


def test_n_samples_stream_and_completions(node):
    session = node.open(Task("t4", "1+2=", "3"), ["policy"])
    client = node.client(session)
    reply = client.chat.completions.create(model="policy", n=3, max_tokens=4,
                                           messages=[{"role": "user", "content": "1+2="}])
    assert len(reply.choices) == 3 and reply.usage.completion_tokens >= 3
    chunks = list(client.chat.completions.create(
        model="policy", max_tokens=4, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "4+4="}]))
    assert chunks[-1].usage is not None and chunks[0].choices[0].delta.role == "assistant"
    done = client.completions.create(model="policy", prompt="5+5=", max_tokens=4, logprobs=1)
    assert len(done.choices[0].logprobs.token_logprobs) >= 1
    assert {m.id for m in client.models.list()} == {"policy"}  # what this rollout may call
    node.gateway.close(session.key)
    # 3 chat samples + 1 streamed + 1 completion: each sampled sequence is a trajectory
    assert len(session.trajectories(0.0, {})) == 5


def test_two_model_names_each_train_their_own_policy(node):
    session = node.open(Task("t5", "3+3=", "6"), ["policy", "verifier"])
    client = node.client(session)
    answer = client.chat.completions.create(model="policy", max_tokens=4, temperature=0,
                                            messages=[{"role": "user", "content": "3+3="}])
    verdict = f"3+3={answer.choices[0].message.content}:"
    client.chat.completions.create(model="verifier", max_tokens=2,
                                   messages=[{"role": "user", "content": verdict}])
    node.gateway.close(session.key)
    by_policy = {t.policy: t for t in session.trajectories(1.0, {})}
    assert set(by_policy) == {"policy", "verifier"}
    for name, traj in by_policy.items():
        trained = {s.source for s in traj.spans if s.source not in ("prompt", "tool")}
        assert trained == {name}


def test_bad_requests_get_clear_errors(node):
    session = node.open(Task("t6", "1+1=", "2"), ["policy"])
    client = node.client(session)
    with pytest.raises(openai.AuthenticationError, match="invalid API key"):
        node.client(session, default_headers={"Authorization": "Bearer sk-wrong"}) \
            .chat.completions.create(model="policy",
                                     messages=[{"role": "user", "content": "1+1="}])
    with pytest.raises(openai.NotFoundError, match="can call: policy"):
        client.chat.completions.create(model="gpt-4o",
                                       messages=[{"role": "user", "content": "1+1="}])
    limit = node.tokenizer.context_length
    with pytest.raises(openai.BadRequestError, match=f"maximum context length is {limit}"):
        client.chat.completions.create(model="policy",
                                       messages=[{"role": "user", "content": "1+" * limit}])
    with pytest.raises(openai.BadRequestError, match="'temperature' must be between"):
        client.chat.completions.create(model="policy", temperature=7,
                                       messages=[{"role": "user", "content": "1+1="}])
    raw = httpx.post(f"{node.gateway.url}/v1/chat/completions", content=b"{not json",
                     headers={"Authorization": f"Bearer {session.key}"})
    assert raw.status_code == 400 and "not JSON" in raw.json()["error"]["message"]
    big = httpx.post(f"{node.gateway.url}/v1/chat/completions",
                     content=b"x" * (node.gateway.settings.max_body_bytes + 1),
                     headers={"Authorization": f"Bearer {session.key}"})
    assert big.status_code == 413 and "max_body_bytes" in big.json()["error"]["message"]
    auth = {"Authorization": f"Bearer {session.key}"}
    wrong_route = httpx.post(f"{node.gateway.url}/v1/embeddings", json={}, headers=auth)
    assert wrong_route.status_code == 404
    assert "POST /v1/chat/completions" in wrong_route.json()["error"]["message"]
    wrong_method = httpx.get(f"{node.gateway.url}/v1/chat/completions", headers=auth)
    assert wrong_method.status_code == 405
    node.gateway.close(session.key)
    # a rollout that ended: its key stops working
    with pytest.raises(openai.AuthenticationError):
        client.chat.completions.create(model="policy",
                                       messages=[{"role": "user", "content": "1+1="}])
