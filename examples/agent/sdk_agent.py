"""The same task with the OpenAI Agents SDK (pip install 'astraflow[agents]').

Train it: python -m astraflow workflow=agent agent.path=examples/agent/sdk_agent.py
"""

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

set_tracing_disabled(True)  # nothing leaves the machine


@function_tool
def calc(expression: str) -> str:
    """Evaluate a sum."""
    left, _, right = expression.partition("+")
    return str(int(left) + int(right or 0))


async def run(task, client):
    model = OpenAIChatCompletionsModel(
        model=client.model,
        openai_client=AsyncOpenAI(base_url=client.base_url, api_key=client.api_key))
    agent = Agent(name="adder", tools=[calc], model=model,
                  model_settings=ModelSettings(max_tokens=8))
    try:
        result = await Runner.run(agent, task.prompt, max_turns=3)
    except MaxTurnsExceeded:
        return 0.0
    return float(str(result.final_output).strip() == task.answer)
