"""The smallest agent: one chat completion per rollout, scored by the run's reward.

One client serves every rollout of its process, each call carrying its rollout's key
(``extra_headers=client.headers``): a client per rollout pays for its set-up and, at its
first call, for its platform headers on a thread -- about a sixth of a short call's CPU.
Its HTTP pool is aiohttp's (``pip install 'openai[aiohttp]'``): httpx's slows down with
many requests waiting in it.

Train it: python -m astraflow workflow=agent agent.path=examples/agent/answer_agent.py
"""

from openai import AsyncOpenAI, DefaultAioHttpClient

_api = None  # one client for every rollout of this process


async def run(task, client):
    global _api
    if _api is None:
        _api = AsyncOpenAI(base_url=client.base_url, api_key=client.api_key,
                           http_client=DefaultAioHttpClient())
    await _api.chat.completions.create(model=client.model, extra_headers=client.headers,
                                       messages=[{"role": "user", "content": task.prompt}])
    return None  # the run's reward (reward=exact_match by default) scores the reply
