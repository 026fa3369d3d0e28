"""``astraflow dataflow``: start the data layer alone (token from $ASTRAFLOW_TOKEN)."""

from __future__ import annotations

import argparse
import os
import sys

from astraflow.dataflow.settings import ORDERS, DataflowSettings, settings_from_yaml
from astraflow.errors import ConfigError
from astraflow.security import TOKEN_ENV, resolve_token


def _policy(text: str) -> tuple[str, int]:
    name, _, staleness = text.partition("=")
    if not name or not staleness.isdigit():
        raise argparse.ArgumentTypeError(f"expected NAME=MAX_STALENESS, got {text!r}")
    return name, int(staleness)


def _advantage(text: str) -> tuple[str, str]:
    name, _, estimator = text.partition("=")
    if not name or not estimator:
        raise argparse.ArgumentTypeError(f"expected NAME=ESTIMATOR, got {text!r}")
    return name, estimator


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="astraflow dataflow",
        description="Start the data layer (task leasing, trajectory buffers, batches). "
        f"Clients authenticate with the bearer token in ${TOKEN_ENV}.",
        epilog="The bound URL is printed and written to STORE/url (use --port 0 for a free port).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--fd", type=int, help="serve on this inherited listening socket "
                        "(a launcher binds it first, to start the components beside the "
                        "data layer); --host names its address in the URL, --port is unused")
    parser.add_argument("--store", help="store directory (SQLite database, url file)")
    parser.add_argument("--config", help="a resolved run config (YAML) to take settings from")
    parser.add_argument("--policy", action="append", type=_policy, metavar="NAME=STALENESS",
                        help="a policy and its max_staleness (repeatable; default policy=2)")
    parser.add_argument("--advantage", action="append", type=_advantage,
                        metavar="NAME=ESTIMATOR",
                        help="a policy's advantage estimator (repeatable; default grpo)")
    parser.add_argument("--task", help="task source option (e.g. arithmetic); default: HTTP only")
    parser.add_argument("--group-size", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--order", choices=ORDERS)
    parser.add_argument("--lease-seconds", type=float)
    parser.add_argument("--retain-seconds", type=float,
                        help="how long done tasks and acknowledged batches are remembered")
    parser.add_argument("--buffer-capacity", type=int)
    parser.add_argument("--heartbeat-timeout", type=float)
    parser.add_argument("--max-body-bytes", type=int)
    parser.add_argument("--bench-echo", action="store_true", default=None,
                        help="mount POST /v1/echo, the ceiling bench/dataflow.py measures "
                        "against (never in a run: it validates nothing)")
    parser.add_argument("--framework-routes", action="store_true", default=None,
                        help="serve leases, submissions and heartbeats through the web "
                        "framework too (the baseline bench/scale.py measures against)")
    return parser


def _settings(args: argparse.Namespace) -> DataflowSettings:
    """The settings of ``--config`` or ``--store``, with the flags given on top."""
    if args.config:
        settings = settings_from_yaml(args.config, store=args.store)
    elif args.store:
        settings = DataflowSettings(store=args.store)
    else:
        raise ConfigError("astraflow dataflow needs --store DIR or --config resolved.yaml")
    overrides = {
        "group_size": args.group_size,
        "batch_size": args.batch_size,
        "order": args.order,
        "lease_seconds": args.lease_seconds,
        "retain_seconds": args.retain_seconds,
        "buffer_capacity": args.buffer_capacity,
        "heartbeat_timeout": args.heartbeat_timeout,
        "max_body_bytes": args.max_body_bytes,
        "bench_echo": args.bench_echo,
        "hot_routes": None if args.framework_routes is None else not args.framework_routes,
        "policies": dict(args.policy) if args.policy else None,
        "task": {"name": args.task} if args.task else None,
    }
    for key, value in overrides.items():
        if value is not None:
            setattr(settings, key, value)
    # each policy keeps the estimator its config names, unless --advantage names another
    settings.advantages = {**{p: a for p, a in settings.advantages.items()
                              if p in settings.policies}, **dict(args.advantage or ())}
    settings.__post_init__()
    return settings


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    settings = _settings(args)
    token = os.environ.get(TOKEN_ENV)
    if not token:
        token = resolve_token()
        print(f"astraflow dataflow: ${TOKEN_ENV} is not set; clients must use token {token}",
              file=sys.stderr)
    from astraflow.dataflow.server import serve

    serve(settings, args.host, args.port, token, fd=args.fd)
    return 0
