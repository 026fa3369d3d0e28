"""``workflow=agent``: train an agent written for the OpenAI API, unchanged.

The agent is the user's: a Python function ``async def run(task, client) -> float |
dict | None`` in a file (``agent.path``, ``agent.function``), or a command line
(``agent.command``) for agents in other languages or sandboxes. It sees a base URL, an
API key and model names -- the node's OpenAI-compatible gateway
(:mod:`astraflow.gateway`) -- and drives the conversation itself: any number of calls,
concurrent calls, tools, several model names (one per policy of the run).

Every call is recorded token by token; each recorded segment becomes a trajectory of
the policy that sampled it. The rollout's reward is what the agent returns, or the
task's reward function (``reward=...``) applied to the last reply. An agent that raises
or runs past ``agent.timeout`` fails its rollout: its segments are kept out of the
advantages, counted, and the first traceback shows in the run's metrics; the node goes
on.

``agent.X`` on the command line is short for ``workflow.X``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from astraflow.contracts import PolicyHandle, Workflow
from astraflow.errors import ConfigError
from astraflow.gateway.settings import FIELDS as GATEWAY
from astraflow.gateway.settings import GatewaySettings
from astraflow.rewards.base import Score, as_score
from astraflow.schema import like, setting
from astraflow.trajectory import TrajectoryBuilder
from astraflow.types import Task, Trajectory
from astraflow.workflows.agent_worker import ERROR_CHARS, ClientConfig
from astraflow.workflows.groups import GroupConfig, first_of, sizes

if TYPE_CHECKING:
    from astraflow.gateway.server import Gateway

CREDIT = ("final", "discount")


@dataclass
class AgentConfig:
    """``workflow=agent``: the agent, its limits and the gateway it calls."""

    name: str = "agent"
    path: str = ""  # a Python file defining the agent function
    function: str = "run"
    command: str = ""  # or: a command line; the gateway's URL and key in its environment
    #: seconds per rollout; a slower agent fails its rollout
    timeout: float = setting(300.0, gt=0)
    #: processes running agent.path's function; null: one per CPU, at most 4 (the
    #: openai client spends ~1.5 ms of CPU a call). 0: on the node's own event loop,
    #: where an agent that blocks or burns CPU stalls the node's engine and gateway
    workers: int | None = setting(None, ge=0, why="0: the node's own event loop")
    #: the model names the agent may call, each a policy of the run
    models: list[str] = field(default_factory=lambda: ["policy"])
    #: final: every segment gets the reward | discount: per call
    credit: str = setting("final", choices=CREDIT)
    discount: float = setting(1.0, ge=0, le=1)
    # the gateway's (astraflow.gateway.settings), with its defaults and ranges
    max_tokens: int = like(GATEWAY["max_tokens"])  # when a request names none
    #: a request's max_tokens above it is lowered to it (Claude Code asks 128k a reply,
    #: and a rollout's length is the run's to choose); null: the context length alone
    max_tokens_cap: int | None = like(GATEWAY["max_tokens_cap"])
    temperature: float = like(GATEWAY["temperature"])  # when a request names none
    tool_parser: str = like(GATEWAY["tool_parser"])
    host: str = like(GATEWAY["host"])
    port: int = like(GATEWAY["port"])  # 0 picks a free port
    #: the host agents are told to use (another machine's sandbox: this node's address)
    advertise_host: str | None = like(GATEWAY["advertise_host"])
    max_body_bytes: int = like(GATEWAY["max_body_bytes"])
    #: over-provisioned groups: start extra samples, train the first back (see
    #: :mod:`astraflow.workflows.groups`)
    group: GroupConfig = field(default_factory=GroupConfig)


class AgentFailed(Exception):
    pass


def default_workers() -> int:
    """``agent.workers=null``: a process per CPU this node may use, at most 4."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


class _Worker:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pending: dict[int, asyncio.Future] = {}
        self.reader: asyncio.Task | None = None


class AgentProcesses:
    """``agent.workers`` processes running the agent function, rollouts spread over
    them (the least busy first), JSON lines in and out
    (:mod:`astraflow.workflows.agent_worker`). A worker that dies fails the rollouts it
    had and is started again for the next -- unless workers died ``workers + 1`` times
    in a row with no rollout finished in between: then none is started again."""

    def __init__(self, path: str, function: str, workers: int) -> None:
        self.argv = [sys.executable, "-m", "astraflow.workflows.agent_worker",
                     str(Path(path).expanduser().resolve()), function]
        self.workers: list[_Worker | None] = [None] * workers
        self._ids = itertools.count()
        self._lock = asyncio.Lock()
        self.deaths_in_a_row = 0
        self.gave_up: str | None = None

    async def ready(self) -> None:
        """Start every worker not running and wait until each has imported the agent:
        a rollout's ``agent.timeout`` counts the agent's own time, not a worker's start
        (seconds for Python and the agent's imports, more on a busy machine)."""
        async with self._lock:
            if self.gave_up:
                raise AgentFailed(self.gave_up)
            for slot, worker in enumerate(self.workers):
                if worker is None:
                    await self._start(slot)

    async def _worker(self) -> _Worker:
        async with self._lock:
            if self.gave_up:
                raise AgentFailed(self.gave_up)
            slot = min(range(len(self.workers)),
                       key=lambda i: -1 if (w := self.workers[i]) is None else len(w.pending))
            return self.workers[slot] or await self._start(slot)

    async def _start(self, slot: int) -> _Worker:
        proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=64 * 1024 * 1024)
        assert proc.stdout is not None
        if not await proc.stdout.readline():  # it says it is ready once the agent imported
            code = await proc.wait()
            self._died(code)
            raise AgentFailed(f"the agent's worker process exited with code {code} while "
                              "loading the agent (its output is above)")
        worker = self.workers[slot] = _Worker(proc)
        worker.reader = asyncio.create_task(self._read(slot, worker))
        return worker

    def _died(self, code: int) -> None:
        self.deaths_in_a_row += 1
        if self.deaths_in_a_row > len(self.workers):
            self.gave_up = (f"the agent's worker processes exited {self.deaths_in_a_row} "
                            f"times in a row (last code {code}) without finishing a "
                            "rollout; not started again")

    async def _read(self, slot: int, worker: _Worker) -> None:
        assert worker.proc.stdout is not None
        while line := await worker.proc.stdout.readline():
            message = json.loads(line)
            self.deaths_in_a_row = 0
            future = worker.pending.pop(message["id"], None)
            if future is None or future.done():
                continue
            if "error" in message:
                future.set_exception(AgentFailed(message["error"]))
            else:
                future.set_result(message["result"])
        code = await worker.proc.wait()
        self.workers[slot] = None
        self._died(code)
        why = (f"the agent's worker process exited with code {code} (its output is above)"
               " while running this rollout")
        for future in worker.pending.values():
            if not future.done():
                future.set_exception(AgentFailed(why))
        worker.pending.clear()

    async def call(self, task: Task, client: ClientConfig) -> Any:
        worker = await self._worker()
        rid = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        worker.pending[rid] = future
        line = json.dumps({"id": rid, "task": asdict(task), "client": asdict(client)})
        assert worker.proc.stdin is not None
        try:
            worker.proc.stdin.write(line.encode() + b"\n")
            await worker.proc.stdin.drain()
            return await future
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise AgentFailed("the agent's worker process is gone") from exc
        except asyncio.CancelledError:  # agent.timeout: the worker drops the rollout
            worker.pending.pop(rid, None)
            with contextlib.suppress(Exception):
                worker.proc.stdin.write(json.dumps({"cancel": rid}).encode() + b"\n")
            raise

    async def aclose(self) -> None:
        for worker in self.workers:
            if worker is None:
                continue
            with contextlib.suppress(Exception):
                assert worker.proc.stdin is not None
                worker.proc.stdin.close()
            try:
                await asyncio.wait_for(worker.proc.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    worker.proc.kill()
                await worker.proc.wait()
            if worker.reader is not None:
                await worker.reader
        self.workers = [None] * len(self.workers)


class AgentWorkflow(Workflow):
    @classmethod
    def roles_for(cls, config: Any) -> tuple[str, ...]:
        return tuple(config.models)

    @classmethod
    def check_config(cls, config: Any) -> Any:
        """Raise a one-line :class:`ConfigError` for a bad set-up; returns the agent
        function (None for a command). The launcher calls it before anything starts."""
        if not config.models:
            raise ConfigError("agent.models is empty: name the model(s) the agent calls")
        if bool(config.path) == bool(config.command):
            raise ConfigError("workflow=agent needs agent.path=FILE (with agent.function) "
                              "or agent.command='CMD ...', not both")
        if config.command:
            argv = shlex.split(config.command)
            if not argv or shutil.which(argv[0]) is None:
                raise ConfigError(f"agent.command={config.command!r}: "
                                  f"{argv[0] if argv else 'nothing'} is not a program on PATH")
            return None
        from astraflow.rewards.python import load_function

        return load_function(config.path, config.function, "agent")[2]

    def __init__(self, config: Any, tokenizer: Any, reward: Any) -> None:
        super().__init__(config, tokenizer, reward)
        self.roles = tuple(config.models)
        # read per rollout: plain values, not the config's slower attribute lookups
        self.timeout, self.credit = float(config.timeout), str(config.credit)
        self.discount = float(config.discount)
        self.function = self.check_config(config)
        self.argv = shlex.split(config.command) if config.command else None
        workers = default_workers() if config.workers is None else int(config.workers)
        self.processes = (AgentProcesses(config.path, config.function, workers)
                          if self.function is not None and workers > 0 else None)
        self.gateway: Gateway | None = None
        self._starting: asyncio.Lock | None = None
        #: rollouts that failed (raised, timed out) and the first failure's traceback
        self.failed = 0
        self.first_error: str | None = None

    async def _gateway(self) -> Gateway:
        from astraflow.gateway.server import Gateway

        if self._starting is None:
            self._starting = asyncio.Lock()
        async with self._starting:
            if self.gateway is None:
                # HTTP clients log every request at INFO: thousands a second on a node
                for name in ("httpx", "httpx2", "openai"):
                    if logging.getLogger(name).level == logging.NOTSET:
                        logging.getLogger(name).setLevel(logging.WARNING)
                gateway = Gateway(self.tokenizer, GatewaySettings.of(self.config))
                await gateway.start()
                self.gateway = gateway
        return self.gateway

    async def aclose(self) -> None:
        if self.processes is not None:
            await self.processes.aclose()
        if self.gateway is not None:
            await self.gateway.stop()
            self.gateway = None

    async def run(self, task: Task, policies: dict[str, PolicyHandle],
                  group_size: int) -> list[Trajectory]:
        gateway = await self._gateway()
        # what a request that names none gets; the evaluator sets temperature 0 for its
        # greedy pass
        gateway.settings.temperature = float(self.config.temperature)
        gateway.settings.max_tokens = int(self.config.max_tokens)
        group_id = task.metadata.get("group_id", task.task_id)
        # over-provisioned: the first rollouts back are kept; a cancelled one's session
        # closes, so its agent's next model call is refused
        started, keep = sizes(group_size)
        rollouts = await first_of(
            lambda i: self._rollout(gateway, task, policies, group_id, i), started, keep,
            reward=lambda trajs: trajs[0].reward if trajs else 0.0)
        return [t for trajs in rollouts for t in trajs]

    async def _rollout(self, gateway: Gateway, task: Task, policies: dict[str, PolicyHandle],
                       group_id: str, sample: int) -> list[Trajectory]:
        session = gateway.open(task, policies, group_id, sample)
        client = ClientConfig(f"{gateway.url}/v1", session.key, self.roles[0],
                              list(self.roles))
        try:
            if self.processes is not None:
                await self.processes.ready()  # not on the agent's clock
            result = await asyncio.wait_for(self._call_agent(task, client), self.timeout)
            score = await self._score(task, result, session.final_text)
        except TimeoutError:
            score = self._failure(f"AgentTimeout: the agent did not finish within "
                                  f"agent.timeout={self.timeout:g}s")
        except Exception:
            score = self._failure(traceback.format_exc()[-ERROR_CHARS:])
        finally:
            session = gateway.close(session.key)
        meta = {"task_type": task.task_type, "sample": sample,
                "rollout": f"{group_id}:{sample}", "agent_calls": session.calls,
                "agent_restarts": session.restarts}
        trajectories = session.trajectories(score.value, meta, self.credit, self.discount,
                                            score.outcome)
        if not trajectories:
            # no call sampled anything (the agent failed first, or answered by itself):
            # the rollout still counts -- a failure in the failure counts, a reward in
            # its group's baseline -- with the prompt as context and nothing to train
            trajectories = [self._untrained(task, group_id, score, meta)]
        return trajectories

    def _untrained(self, task: Task, group_id: str, score: Score,
                   meta: dict[str, Any]) -> Trajectory:
        try:
            prompt = self.tokenizer.encode_prompt(task.prompt)
        except Exception:  # a prompt the template refuses: its text will do as context
            prompt = self.tokenizer.encode(str(task.prompt))
        builder = TrajectoryBuilder(task.task_id, group_id)
        builder.add_context(prompt or list(self.tokenizer.stop_token_ids)[:1])
        return builder.build(self.roles[0], score.value, {**meta, "rollout_reward": score.value},
                             score.outcome)

    def _failure(self, error: str) -> Score:
        self.failed += 1
        if self.first_error is None:
            self.first_error = error
        return Score(0.0, error=error)

    async def _call_agent(self, task: Task, client: ClientConfig) -> Any:
        if self.processes is not None:
            return await self.processes.call(task, client)
        if self.function is not None:  # agent.workers=0
            from astraflow.workflows.agent_worker import call

            return await call(self.function, task, client)
        return await self._run_command(task, client)

    async def _run_command(self, task: Task, client: ClientConfig) -> Any:
        env = {**os.environ, **client.env(), "ASTRAFLOW_TASK": json.dumps(asdict(task))}
        proc = await asyncio.create_subprocess_exec(
            *(self.argv or []), env=env, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True)
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:  # the timeout: the agent and its children go
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace")[-ERROR_CHARS:]
            raise AgentFailed(f"agent.command exited with {proc.returncode}:\n{tail}")
        lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
        if not lines:
            return None
        try:
            return json.loads(lines[-1])
        except ValueError as exc:
            raise AgentFailed(f"agent.command's last line is not JSON: {lines[-1][:200]!r}"
                              ) from exc

    async def _score(self, task: Task, result: Any, final_text: str) -> Score:
        """The agent's own reward, else the task's reward of the last reply."""
        if isinstance(result, dict) and "reward" in result:
            result = result["reward"]
        if isinstance(result, dict) and "answer" in result and "score" not in result:
            return await self.score(task, str(result["answer"]))
        if result is None:
            return await self.score(task, final_text)
        try:
            return as_score(result)
        except Exception as exc:
            raise AgentFailed(f"the agent returned {result!r}: expected a number, a dict "
                              "with 'reward' or 'score', or None") from exc
