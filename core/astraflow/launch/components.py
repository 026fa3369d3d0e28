"""``astraflow raas``, ``astraflow train`` and ``astraflow eval``: one component alone.

Each connects to a data layer by URL (token from ``ASTRAFLOW_TOKEN``), so it can run
on this machine or join a running job from another one.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from astraflow.commands import command
from astraflow.components import load_config
from astraflow.security import TOKEN_ENV
from astraflow.trainer import distributed


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--connect", required=True, metavar="URL", help="data layer URL")
    parser.add_argument("--config", required=True, help="the run's resolved config.yaml")
    parser.add_argument("--work-dir", default=".", help="where local state is kept")


def _token() -> str:
    token = os.environ.get(TOKEN_ENV)
    if not token:
        raise SystemExit(f"astraflow: set {TOKEN_ENV} to the data layer's token")
    return token


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # one line per request would drown the component's own log
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _stop_on_signals(loop: asyncio.AbstractEventLoop) -> asyncio.Event:
    """The first SIGTERM/SIGINT stops the component gracefully (a node finishes its
    leases); a second one ends it at once, e.g. when the data layer it would report to
    is gone."""
    stop = asyncio.Event()

    def handle(sig: signal.Signals) -> None:
        if stop.is_set():
            print(f"astraflow: {sig.name} again; exiting now", file=sys.stderr, flush=True)
            os._exit(128 + sig.value)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, handle, sig)
    return stop


@command("raas")
def cmd_raas(argv: list[str]) -> int:
    """Run a RaaS node: lease tasks, run workflows, push trajectories, pull weights."""
    from astraflow.raas.node import NodeOptions, RaaSNode
    from astraflow.raas.settings import settings_from_config

    parser = argparse.ArgumentParser(prog="astraflow raas", description=cmd_raas.__doc__)
    _common(parser)
    parser.add_argument("--pool", default="default")
    parser.add_argument("--region", default="local")
    parser.add_argument("--name", default=None)
    parser.add_argument("--concurrency", type=int, default=64,
                        help="most tasks in flight (fewer while fewer keep the trainers fed)")
    parser.add_argument("--sync-tasks", type=int, default=0,
                        help="synchronous baseline: tasks per iteration (0: asynchronous)")
    parser.add_argument("--throttle", type=float, default=1.0,
                        help="fraction of full rollout throughput to deliver, in (0, 1]")
    args = parser.parse_args(argv)
    if not 0 < args.throttle <= 1:
        parser.error(f"--throttle {args.throttle}: expected a fraction in (0, 1]")
    _logging()
    settings = settings_from_config(load_config(args.config))
    options = NodeOptions(pool=args.pool, region=args.region, concurrency=args.concurrency,
                          sync_tasks=args.sync_tasks, throttle=args.throttle)

    async def main() -> None:
        stop = _stop_on_signals(asyncio.get_running_loop())
        node = RaaSNode(settings, args.connect, _token(), args.work_dir, options, args.name)
        await node.run(stop)

    asyncio.run(main())
    return 0


@command("train")
def cmd_train(argv: list[str]) -> int:
    """Run the trainer of one policy: pull batches, train, publish weights."""
    from astraflow.trainer.runtime import TrainerRuntime
    from astraflow.trainer.settings import settings_from_config

    parser = argparse.ArgumentParser(prog="astraflow train", description=cmd_train.__doc__)
    _common(parser)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--metrics", default=None, help="JSONL file for per-step metrics")
    args = parser.parse_args(argv)
    _logging()
    settings = settings_from_config(load_config(args.config), args.policy)
    if settings.world_size > 1 and not distributed():
        _torchrun(settings.world_size, argv)  # does not return
    TrainerRuntime(settings, args.connect, _token(), args.policy, args.work_dir,
                   args.metrics).run()
    return 0


def _torchrun(world_size: int, argv: list[str]) -> None:
    """Become ``torchrun`` running ``world_size`` ranks of this trainer on this machine.

    The process stays the one the launcher started (``exec``), so stopping it stops
    every rank; ``torchrun`` ends all ranks when one fails, and the launcher restarts
    the whole trainer. For ranks on several machines, start ``torchrun`` yourself.
    """
    import sys

    from astraflow.lifecycle import LAUNCHER_ENV, READY_ENV

    if READY_ENV in os.environ:  # started by a launcher: the ranks end with this process
        os.environ[LAUNCHER_ENV] = str(os.getpid())
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc-per-node={world_size}", "--max-restarts=0", "-m", "astraflow", "train",
        *argv])


@command("eval")
def cmd_eval(argv: list[str]) -> int:
    """Follow one policy's weight stream and score the held-out split."""
    from astraflow.evaluate import Evaluator, eval_settings

    parser = argparse.ArgumentParser(prog="astraflow eval", description=cmd_eval.__doc__)
    _common(parser)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--metrics", required=True)
    args = parser.parse_args(argv)
    _logging()
    cfg = load_config(args.config)
    # held-out evaluation is off the critical path: where it shares CPUs with a trainer
    # or an engine, it takes what they leave
    os.nice(max(0, int(cfg.get("eval_niceness", 0))))
    evaluator = Evaluator(eval_settings(cfg), args.connect, _token(), args.policy, args.work_dir,
                          args.metrics)
    asyncio.run(evaluator.run())
    return 0
