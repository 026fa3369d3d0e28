"""``astraflow dataflow``: start the data layer alone (token from $ASTRAFLOW_TOKEN)."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from astraflow.dataflow.settings import (
    DEFAULT_ADVANTAGE,
    DataflowSettings,
    settings_from_yaml,
)
from astraflow.errors import ConfigError
from astraflow.schema import AstraFlowConfig, DataflowConfig
from astraflow.security import TOKEN_ENV, resolve_token

#: settings with a flag of their own elsewhere, or none (given as --policy, --advantage,
#: --task, --store; the data algorithms come from --config only)
_NOT_FLAGS = {"store", "policies", "advantages", "task", "data", "hot_routes"}


def _policy(text: str) -> tuple[str, int | None]:
    name, sep, staleness = text.partition("=")
    if not name or (sep and not staleness.isdigit()):
        raise argparse.ArgumentTypeError(f"expected NAME or NAME=MAX_STALENESS, got {text!r}")
    return name, int(staleness) if staleness else None


def _advantage(text: str) -> tuple[str, str]:
    name, _, estimator = text.partition("=")
    if not name or not estimator:
        raise argparse.ArgumentTypeError(f"expected NAME=ESTIMATOR, got {text!r}")
    return name, estimator


def _flags() -> list[dataclasses.Field[Any]]:
    """The settings given as ``--name-with-dashes``: each scalar one of
    :class:`DataflowSettings`, typed, with its default and range from the schema."""
    return [f for f in dataclasses.fields(DataflowSettings)
            if f.name not in _NOT_FLAGS and f.default is not dataclasses.MISSING]


def _docs() -> dict[str, str]:
    """Each setting's ``#:`` comment, where the settings declare it or where they take it
    from (the run config's schema)."""
    from astraflow.fielddocs import field_docs

    return {**field_docs(AstraFlowConfig), **field_docs(DataflowConfig),
            **field_docs(DataflowSettings)}


def _add_flag(parser: argparse.ArgumentParser, f: dataclasses.Field[Any],
              docs: dict[str, str]) -> None:
    flag = "--" + f.name.replace("_", "-")
    if isinstance(f.default, bool):
        parser.add_argument(flag, action="store_true", default=None,
                            help=docs.get(f.name))
        return
    limits = f.metadata.get("astraflow", {})
    bounds = [f"{word} {limits[key]:g}" for key, word in
              (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")) if key in limits]
    if "choices" in limits:
        bounds.append("one of " + ", ".join(map(str, limits["choices"])))
    said = "; ".join([*filter(None, [docs.get(f.name)]), f"default {f.default}", *bounds])
    parser.add_argument(flag, type=type(f.default), choices=limits.get("choices"),
                        default=None, metavar=f.name.upper(), help=said)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="astraflow dataflow",
        description="Start the data layer (task leasing, trajectory buffers, batches). "
        f"Clients authenticate with the bearer token in ${TOKEN_ENV}. Settings not given "
        "take --config's, else the run config's defaults.",
        epilog="The bound URL is printed and written to STORE/url (use --port 0 for a free port).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--fd", type=int, help="serve on this inherited listening socket "
                        "(a launcher binds it first, to start the components beside the "
                        "data layer); --host names its address in the URL, --port is unused")
    parser.add_argument("--store", help="store directory (SQLite database, url file)")
    parser.add_argument("--config", help="a resolved run config (YAML) to take settings from")
    parser.add_argument("--policy", action="append", type=_policy, metavar="NAME[=STALENESS]",
                        help="a policy and its max_staleness in versions (repeatable; "
                        "without one it is derived from the measured turnaround and "
                        "trainer pace; default: one policy named 'policy', derived)")
    parser.add_argument("--advantage", action="append", type=_advantage,
                        metavar="NAME=ESTIMATOR", help="a policy's advantage estimator "
                        f"(repeatable; default {DEFAULT_ADVANTAGE})")
    parser.add_argument("--task", help="task source option (e.g. arithmetic); default: HTTP only")
    docs = _docs()
    for f in _flags():
        _add_flag(parser, f, docs)
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
    overrides = {f.name: getattr(args, f.name) for f in _flags()}
    overrides.update({
        "hot_routes": None if args.framework_routes is None else not args.framework_routes,
        "policies": dict(args.policy) if args.policy else None,
        "task": {"name": args.task} if args.task else None,
    })
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
