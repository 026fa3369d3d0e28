"""The smallest agent: one chat completion per rollout, scored by the run's reward.

It keeps one HTTP connection pool for all the rollouts of its process (aiohttp, from
``pip install 'openai[aiohttp]'``): a new client per rollout would load the CA bundle
each time, and httpx's pool slows down with many requests waiting in it.

Train it: python -m astraflow workflow=agent agent.path=examples/agent/answer_agent.py
"""

from openai import AsyncOpenAI, DefaultAioHttpClient

_http = None


async def run(task, client):
    global _http
    if _http is None:
        _http = DefaultAioHttpClient()
    api = AsyncOpenAI(base_url=client.base_url, api_key=client.api_key, http_client=_http)
    await api.chat.completions.create(model=client.model,
                                      messages=[{"role": "user", "content": task.prompt}])
    return None  # the run's reward (reward=exact_match by default) scores the reply
