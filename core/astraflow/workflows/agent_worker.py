"""A process that runs a node's Python agents (``agent.workers``).

The node sends one JSON line per rollout on this process's stdin -- ``{"id", "task",
"client"}`` -- and reads one JSON line per finished rollout from the pipe that was its
stdout: ``{"id", "result"}`` or ``{"id", "error"}`` (a traceback). ``{"cancel": id}``
cancels a rollout (its ``agent.timeout`` ran out). Whatever the agent prints goes to the
node's stderr, never into the protocol. JSON only: nothing is unpickled.

Agents run here, not on the node's event loop, so an agent that burns CPU (a framework,
a tool, a parser) or blocks (``time.sleep``, a synchronous client) does not stall the
node's engine, gateway, leases and weight pulls -- and a crashing agent does not take
the node with it.

    python -m astraflow.workflows.agent_worker AGENT_FILE FUNCTION
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
import traceback
from dataclasses import dataclass
from typing import Any

#: longest traceback kept with a failed rollout (here and in the node)
ERROR_CHARS = 4000
#: longest protocol line (a task with a long prompt and metadata)
LINE_LIMIT = 64 * 1024 * 1024



@dataclass
class ClientConfig:
    """All an agent is told: where to send requests, its key and the model names.

    ``AsyncOpenAI(base_url=client.base_url, api_key=client.api_key)``, or for an agent
    on Anthropic's client ``AsyncAnthropic(base_url=client.anthropic_base_url,
    api_key=client.api_key)``.
    """

    base_url: str
    api_key: str
    model: str
    models: list[str]

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    @property
    def headers(self) -> dict[str, str]:
        """This rollout's key as request headers, for one client shared by every rollout
        of a process: ``extra_headers=client.headers`` on each call. (A client per
        rollout costs the ``openai`` client's set-up and, at its first call, a thread
        for its platform headers: a sixth of a short call's CPU.)"""
        return {"Authorization": f"Bearer {self.api_key}", "x-api-key": self.api_key}

    @property
    def anthropic_base_url(self) -> str:
        """The gateway's root: Anthropic's client adds ``/v1/messages`` itself."""
        return self.base_url.removesuffix("/").removesuffix("/v1")

    def env(self) -> dict[str, str]:
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key,
                "ANTHROPIC_BASE_URL": self.anthropic_base_url,
                "ANTHROPIC_API_KEY": self.api_key,
                # Claude Code asks for its own model names unless these name one served
                "ANTHROPIC_MODEL": self.model, "ANTHROPIC_SMALL_FAST_MODEL": self.model,
                "ANTHROPIC_DEFAULT_OPUS_MODEL": self.model,
                "ANTHROPIC_DEFAULT_SONNET_MODEL": self.model,
                "ANTHROPIC_DEFAULT_HAIKU_MODEL": self.model,
                "ASTRAFLOW_MODEL": self.model, "ASTRAFLOW_MODELS": ",".join(self.models)}


def _jsonable(result: Any) -> Any:
    if hasattr(result, "__dataclass_fields__"):
        from dataclasses import asdict

        result = asdict(result)
    json.dumps(result)  # raises TypeError on what cannot cross
    return result


async def call(function: Any, task: Any, client: Any) -> Any:
    """The agent's result: awaited, or run on a thread if the function is synchronous."""
    if inspect.iscoroutinefunction(function):
        return await function(task, client)
    result = await asyncio.to_thread(function, task, client)
    return await result if inspect.isawaitable(result) else result


async def serve(function: Any, out: Any) -> None:
    from astraflow.types import Task

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    running: dict[int, asyncio.Task] = {}

    def reply(message: dict[str, Any]) -> None:
        out.write(json.dumps(message).encode() + b"\n")

    async def one(rid: int, task: Task, client: ClientConfig) -> None:
        try:
            result = _jsonable(await call(function, task, client))
        except asyncio.CancelledError:
            return  # the node gave up on it (agent.timeout) and is not waiting
        except TypeError as exc:
            reply({"id": rid, "error": f"the agent returned something that is not JSON "
                                       f"(a number, a dict or None is expected): {exc}"})
        except BaseException:
            reply({"id": rid, "error": traceback.format_exc()[-ERROR_CHARS:]})
        else:
            reply({"id": rid, "result": result})
        finally:
            running.pop(rid, None)

    while line := await reader.readline():
        message = json.loads(line)
        if "cancel" in message:
            if (job := running.get(message["cancel"])) is not None:
                job.cancel()
            continue
        task = Task(**message["task"])
        client = ClientConfig(**message["client"])
        running[message["id"]] = asyncio.create_task(one(message["id"], task, client))
    # stdin closed: the node is gone. Exit now, not when the agents' threads return (a
    # synchronous agent may be blocked for good), and without the complaints of module-
    # level clients nobody closed
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str]) -> None:
    path, name = argv
    # the protocol keeps the original stdout; the agent's prints go to stderr
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from astraflow.rewards.python import load_function

    function = load_function(path, name, "agent")[2]
    out.write(b'{"ready": true}\n')  # the node starts the agent's clock from here
    asyncio.run(serve(function, out))


if __name__ == "__main__":
    main(sys.argv[1:])
