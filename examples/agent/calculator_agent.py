"""An agent written for the OpenAI API: it asks, runs calculator calls, asks again.

Train it: python -m astraflow workflow=agent agent.path=examples/agent/calculator_agent.py
"""

import json

from openai import AsyncOpenAI, DefaultAioHttpClient

CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate a sum or a difference.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}


_api = None  # one client for every rollout of this process (see answer_agent.py)


def calculator(expression):
    for op in "+-":
        left, sep, right = expression.rpartition(op)
        if sep and left:
            return str(int(left) + int(right) if op == "+" else int(left) - int(right))
    return "error"


async def run(task, client):
    """Ask; run any calculator calls; ask again with the results (three calls at most).
    Returns nothing: the run's reward scores the last answer."""
    global _api
    if _api is None:
        _api = AsyncOpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0,
                           http_client=DefaultAioHttpClient())
    messages = [{"role": "user", "content": task.prompt}]
    for _ in range(3):
        reply = await _api.chat.completions.create(model=client.model, messages=messages,
                                                   tools=[CALC], extra_headers=client.headers)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": calculator(args["expression"])})
    return None
