"""The Responses API (``openai`` client's ``responses.create``) and the Messages API
(``anthropic`` client's ``messages.create``) on the node's gateway: an agent written for
either trains unchanged, on exactly the tokens the engine sampled."""

from __future__ import annotations

import json

import openai
import pytest

from astraflow.types import Task

anthropic = pytest.importorskip("anthropic", reason="pip install 'astraflow[anthropic]'")

SCHEMA = {"type": "object", "properties": {"expression": {"type": "string"}},
          "required": ["expression"]}
RESPONSES_CALC = {"type": "function", "name": "calc", "description": "Evaluate a sum.",
                  "parameters": SCHEMA}
MESSAGES_CALC = {"name": "calc", "description": "Evaluate a sum.", "input_schema": SCHEMA}
#: the API takes a temperature; recent ``anthropic`` clients no longer name it
GREEDY = {"temperature": 0}


def calculator(expression: str) -> str:
    a, b = expression.split("+")
    return str(int(a) + int(b))


def assert_trains_what_was_sampled(node, session, calls: int) -> None:
    """One trajectory whose trained tokens and log-probs are the engine's samples, bit
    for bit, in order; the agent's history extended every call (no restart)."""
    assert session.calls == calls and session.restarts == 0
    (traj,) = session.trajectories(1.0, {})
    traj.validate()
    sampled = node.spies["policy"].sampled
    assert len(sampled) == calls
    mask = traj.loss_mask
    assert [t for t, m in zip(traj.tokens, mask, strict=True) if m] == \
        [t for g in sampled for t in g.token_ids]
    assert [lp for lp, m in zip(traj.logprobs, mask, strict=True) if m] == \
        [lp for g in sampled for lp in g.logprobs]


def responses_agent(client, question: str, follow_up: str) -> list:
    """An agent as written for the Responses API: the whole input sent each turn."""
    items: list = [{"role": "user", "content": question}]
    outputs = []
    for turn in range(3):
        if turn == 2:
            items.append({"role": "user", "content": follow_up})
        resp = client.responses.create(model="policy", input=items, tools=[RESPONSES_CALC],
                                       temperature=0, max_output_tokens=12)
        outputs.append(resp)
        for item in resp.output:
            items.append(item.model_dump(exclude_none=True))
            if item.type == "function_call":
                args = json.loads(item.arguments)
                items.append({"type": "function_call_output", "call_id": item.call_id,
                              "output": calculator(args["expression"])})
    return outputs


def test_a_responses_api_tool_agent_trains_exactly_the_sampled_tokens(node):
    node.spies["policy"].sampled.clear()
    session = node.open(Task("r1", "3+4=", "7"), ["policy"])
    outputs = responses_agent(node.client(session), "3+4=", "5+2=")
    node.gateway.close(session.key)
    call = outputs[0].output[0]
    assert call.type == "function_call" and call.name == "calc"
    assert json.loads(call.arguments) == {"expression": "3+4"}
    assert outputs[1].output_text == "7" and outputs[1].status == "completed"
    assert outputs[0].usage.output_tokens >= 1
    assert_trains_what_was_sampled(node, session, 3)


def test_previous_response_id_continues_the_same_tokens(node):
    node.spies["policy"].sampled.clear()
    session = node.open(Task("r2", "6+2=", "8"), ["policy"])
    client = node.client(session)
    first = client.responses.create(model="policy", input="6+2=", tools=[RESPONSES_CALC],
                                    temperature=0, max_output_tokens=12)
    (call,) = [i for i in first.output if i.type == "function_call"]
    second = client.responses.create(
        model="policy", previous_response_id=first.id, tools=[RESPONSES_CALC],
        temperature=0, max_output_tokens=12,
        input=[{"type": "function_call_output", "call_id": call.call_id,
                "output": calculator(json.loads(call.arguments)["expression"])}])
    with pytest.raises(openai.NotFoundError, match="no response 'resp_nope'"):
        client.responses.create(model="policy", previous_response_id="resp_nope",
                                input="1+1=")
    node.gateway.close(session.key)
    assert second.output_text == "8"
    assert_trains_what_was_sampled(node, session, 2)


def test_a_responses_stream_ends_with_the_completed_response(node):
    session = node.open(Task("r3", "1+2=", "3"), ["policy"])
    client = node.client(session)
    events = list(client.responses.create(model="policy", input="1+2=", max_output_tokens=4,
                                          temperature=0, stream=True))
    node.gateway.close(session.key)
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed",
                                                             "response.incomplete")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def messages_agent(client, question: str, follow_up: str) -> list:
    """An agent as written for Anthropic's Messages API."""
    messages: list = [{"role": "user", "content": question}]
    replies = []
    for turn in range(3):
        if turn == 2:
            messages.append({"role": "user", "content": follow_up})
        reply = client.messages.create(model="policy", max_tokens=12, extra_body=GREEDY,
                                       tools=[MESSAGES_CALC], messages=messages)
        replies.append(reply)
        messages.append({"role": "assistant",
                         "content": [b.model_dump(exclude_none=True) for b in reply.content]})
        results = [{"type": "tool_result", "tool_use_id": b.id,
                    "content": calculator(b.input["expression"])}
                   for b in reply.content if b.type == "tool_use"]
        if results:
            messages.append({"role": "user", "content": results})
    return replies


def anthropic_client(node, session, key: str | None = None):
    from astraflow.workflows.agent_worker import ClientConfig

    config = ClientConfig(f"{node.gateway.url}/v1", session.key, "policy", ["policy"])
    return anthropic.Anthropic(base_url=config.anthropic_base_url,
                               api_key=key or config.api_key, max_retries=0, timeout=60)


def test_a_messages_api_tool_agent_trains_exactly_the_sampled_tokens(node):
    node.spies["policy"].sampled.clear()
    session = node.open(Task("m1", "3+4=", "7"), ["policy"])
    replies = messages_agent(anthropic_client(node, session), "3+4=", "5+2=")
    node.gateway.close(session.key)
    (use,) = replies[0].content
    assert use.type == "tool_use" and use.name == "calc" and use.input == {"expression": "3+4"}
    assert replies[0].stop_reason == "tool_use"
    assert [b.text for b in replies[1].content] == ["7"]
    assert replies[1].stop_reason in ("end_turn", "max_tokens")
    assert replies[0].usage.input_tokens >= 4
    assert_trains_what_was_sampled(node, session, 3)


def test_a_messages_stream_and_errors_in_anthropics_format(node):
    session = node.open(Task("m2", "2+2=", "4"), ["policy"])
    client = anthropic_client(node, session)
    with client.messages.stream(model="policy", max_tokens=4, extra_body=GREEDY,
                                messages=[{"role": "user", "content": "2+2="}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "".join(b.text for b in final.content if b.type == "text")
    assert final.usage.output_tokens >= 1
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(model="policy", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    assert "'image'" in bad.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError, match="does not exist here"):
        client.messages.create(model="nope", max_tokens=4,
                               messages=[{"role": "user", "content": "1+1="}])
    node.gateway.close(session.key)
    with pytest.raises(anthropic.AuthenticationError, match="invalid API key"):
        client.messages.create(model="policy", max_tokens=4,
                               messages=[{"role": "user", "content": "1+1="}])


@pytest.mark.parametrize("example", ["anthropic_agent.py", "sdk_agent.py"])
def test_the_example_agents_train_unchanged(node, example):
    """``examples/agent/anthropic_agent.py`` (Messages API) and ``sdk_agent.py`` (the
    Agents SDK's default model class: the Responses API) as a user runs them: given the
    rollout's client config, their calls are recorded and train what was sampled."""
    import importlib.util
    from pathlib import Path

    from astraflow.workflows.agent_worker import ClientConfig

    if example == "sdk_agent.py":
        pytest.importorskip("agents", reason="pip install 'astraflow[agents]'")
    path = Path(__file__).parents[3] / "examples" / "agent" / example
    spec = importlib.util.spec_from_file_location(example[:-3], path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    node.spies["policy"].sampled.clear()
    session = node.open(Task("m3", "2+5=", "7"), ["policy"])
    client = ClientConfig(f"{node.gateway.url}/v1", session.key, "policy", ["policy"])
    node.loop.run(module.run(session.task, client))
    node.gateway.close(session.key)
    assert session.calls >= 1 and session.restarts == 0
    (traj,) = session.trajectories(1.0, {})
    trained = [t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m]
    assert trained == [t for g in node.spies["policy"].sampled for t in g.token_ids]
