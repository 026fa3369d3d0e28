"""The same task with the OpenAI Agents SDK (pip install 'astraflow[agents]'), on the
SDK's default model class: it talks to the node's Responses API (/v1/responses).

One HTTP connection pool serves all the rollouts of the agent's process; each rollout
has its own key, so it gets its own (light) client over that pool.

Train it: python -m astraflow workflow=agent agent.path=examples/agent/sdk_agent.py
"""

from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelBehaviorError,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, DefaultAioHttpClient

set_tracing_disabled(True)  # nothing leaves the machine
_http = None


@function_tool
def calc(expression: str) -> str:
    """Evaluate a sum."""
    left, _, right = expression.partition("+")
    try:
        return str(int(left) + int(right or 0))
    except ValueError:  # a malformed expression is the model's mistake: say so and go on
        return "error"


async def run(task, client):
    global _http
    if _http is None:
        _http = DefaultAioHttpClient()
    model = OpenAIResponsesModel(
        model=client.model,
        openai_client=AsyncOpenAI(base_url=client.base_url, api_key=client.api_key,
                                  http_client=_http))
    agent = Agent(name="adder", tools=[calc], model=model,
                  model_settings=ModelSettings(max_tokens=16))
    try:
        result = await Runner.run(agent, task.prompt, max_turns=3)
    except (MaxTurnsExceeded, ModelBehaviorError):  # no answer in 3 turns, or a reply
        return 0.0  # cut at max_tokens (the SDK raises on one): trained, scored 0
    return float(str(result.final_output).strip() == task.answer)
