"""An agent written for Anthropic's Messages API (pip install 'astraflow[anthropic]'):
it asks, runs calculator calls, asks again -- the node's /v1/messages answers it.

Train it: python -m astraflow workflow=agent agent.path=examples/agent/anthropic_agent.py
"""

from anthropic import AsyncAnthropic

CALC = {"name": "calc", "description": "Evaluate a sum.",
        "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}},
                         "required": ["expression"]}}


def calculator(expression):
    left, _, right = expression.partition("+")
    try:
        return str(int(left) + int(right or 0))
    except ValueError:
        return "error"


async def run(task, client):
    """Three calls at most; returns nothing: the run's reward scores the last answer."""
    api = AsyncAnthropic(base_url=client.anthropic_base_url, api_key=client.api_key,
                         max_retries=0)
    messages = [{"role": "user", "content": task.prompt}]
    try:
        for _ in range(3):
            reply = await api.messages.create(model=client.model, max_tokens=12,
                                              tools=[CALC], messages=messages)
            messages.append({"role": "assistant", "content": [
                block.model_dump(exclude_none=True) for block in reply.content]})
            results = [{"type": "tool_result", "tool_use_id": block.id,
                        "content": calculator(str(block.input.get("expression", "")))}
                       for block in reply.content if block.type == "tool_use"]
            if not results:
                break
            messages.append({"role": "user", "content": results})
    finally:
        await api.close()
    return None
