"""``astraflow`` / ``python -m astraflow``: run a job, or start one component alone.

``python -m astraflow [OVERRIDES...]`` composes the config and runs the job locally.
Subcommands: ``plugins``, ``dataflow``, ``raas``, ``train``, ``run``, ``tinker``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from astraflow.commands import COMMANDS, command
from astraflow.errors import AstraFlowError


@command("plugins")
def cmd_plugins(argv: list[str]) -> int:
    """List installed plugins, their hooks and what they provide."""
    parser = argparse.ArgumentParser(prog="astraflow plugins", description=cmd_plugins.__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    from astraflow.plugins import get_registry

    infos = [info.as_dict() for info in get_registry().plugins.values()]
    if args.json:
        print(json.dumps(infos, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="AstraFlow plugins")
    for col in ("plugin", "distribution", "version", "provides", "hooks"):
        table.add_column(col, overflow="fold")
    for info in infos:
        provides = "; ".join(f"{k}: {', '.join(v)}" for k, v in info["provides"].items())
        if "error" in info:
            provides = f"[red]failed: {info['error']}[/red]"
        table.add_row(
            info["name"], info["distribution"], info["version"], provides, "\n".join(info["hooks"])
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(table)
    return 0


def _hydra_flags(argv: list[str]) -> tuple[str | None, bool, str | None, list[str]]:
    """Hydra's own flags, as Hydra users type them: ``--cfg``/``-c`` with ``job`` (the
    default), ``all`` or ``hydra``; ``--resolve``; ``--package``/``-p KEY``. The rest of
    ``argv`` is overrides."""
    what, resolve, package, rest = None, False, None, []
    args = iter(argv)
    for arg in args:
        if arg in ("--cfg", "-c"):
            what = "job"
            nxt = next(args, None)
            if nxt in ("job", "all", "hydra"):
                what = nxt
            elif nxt is not None:
                rest.append(nxt)
        elif arg.startswith("--cfg="):
            what = arg.split("=", 1)[1]
        elif arg == "--resolve":
            resolve = True
        elif arg in ("--package", "-p"):
            package = next(args, None)
        elif arg.startswith("--package="):
            package = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return what, resolve, package, rest


@command("run")
def cmd_run(argv: list[str]) -> int:
    """Compose the config from OVERRIDES and run the job on this machine."""
    what, resolve, package, argv = _hydra_flags(argv)
    parser = argparse.ArgumentParser(
        prog="python -m astraflow",
        description=cmd_run.__doc__,
        epilog="Examples: python -m astraflow +raas=vllm +trainer=hf steps=20",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. raas=vllm seed=1")
    args = parser.parse_args(argv)
    from omegaconf import OmegaConf

    from astraflow.config import compose_config
    from astraflow.errors import ConfigError

    if what not in (None, "job", "all", "hydra"):
        raise ConfigError(f"--cfg {what}: choose job, all or hydra")
    if what == "hydra":
        raise ConfigError("--cfg hydra: a run has no Hydra job settings (no output "
                          "directory, sweeper or job logging); its config is --cfg job")
    if what:
        cfg = compose_config(args.overrides)
        node = OmegaConf.select(cfg, package) if package else cfg
        if package and node is None:
            raise ConfigError(f"--package {package}: the config has no such key")
        print(OmegaConf.to_yaml(node, resolve=resolve) if OmegaConf.is_config(node)
              else node)
        return 0
    from astraflow.launch import preload

    # the parent components fork from imports torch while the config is composed and
    # checked; the local launcher takes it over (a Ray run, or preload=false, ends it)
    early = preload.start_early(args.overrides)
    try:
        cfg = compose_config(args.overrides)
        if cfg.launcher.get("kind") == "ray":
            from astraflow.launch.ray import run as ray_run

            if early is not None:
                early.close()
            return ray_run(cfg)
        from astraflow.launch.local import run

        return run(cfg, preloader=early)
    finally:
        if early is not None:
            early.close()


def _help(argv: list[str]) -> int:
    """``--help`` (commands, config groups and options, settings) or ``--help TOPIC``."""
    from astraflow import helptext

    at = argv.index("-h") if "-h" in argv else argv.index("--help")
    topic = argv[at + 1] if at + 1 < len(argv) and not argv[at + 1].startswith("-") else None
    try:
        print(helptext.topic(topic) if topic else helptext.overview(COMMANDS))
    except AstraFlowError as exc:
        print(f"astraflow: error: {exc}", file=sys.stderr)
        return 2
    return 0


def _load_subcommands() -> None:
    """Modules that register further subcommands (imported lazily: cheap)."""
    import astraflow.launch.components
    import astraflow.newplugin  # noqa: F401


@command("dataflow")
def cmd_dataflow(argv: list[str]) -> int:
    """Start the data layer service alone."""
    from astraflow.dataflow.cli import main as dataflow_main

    return dataflow_main(argv)


@command("tinker")
def cmd_tinker(argv: list[str]) -> int:
    """Serve the Tinker API (the tinker SDK's training and sampling clients)."""
    try:
        from astraflow_tinker.cli import main as tinker_main
    except ImportError as exc:
        print(f"astraflow tinker needs its plugin: pip install astraflow-plugin-tinker "
              f"({exc})", file=sys.stderr)
        return 2
    return tinker_main(argv)


@command("_preload")
def cmd_preload(argv: list[str]) -> int:
    """(internal) The parent the local launcher forks components from."""
    parser = argparse.ArgumentParser(prog="astraflow _preload", description=cmd_preload.__doc__)
    parser.add_argument("--fd", type=int, required=True, help="the launcher's socket")
    args = parser.parse_args(argv)
    from astraflow.launch.preload_server import main as preload_main

    component = preload_main(args.fd)
    if component is not None:  # a forked component: run it as `astraflow ARGS` would
        main(component)  # ends the process
    # the parent has nothing to clean up: finalising its interpreter would only print
    # the leak report of a library it imported (triton's)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _unknown_setting(exc: Exception, argv: list[str]) -> str | None:
    """For a mistyped setting: one line naming it and the settings its section has."""
    import re

    found = re.search(r"Could not override '([^']+)'", str(exc))
    if found is None:
        return None
    key = overridden = found.group(1)
    # a section set whole (`launcher.trainer={num_gpu: 1}`): the mistyped key inside it
    inner = re.search(r"(?:is not in struct|not in '\w+')\s+full_key: (\S+)",
                      str(exc.__cause__))
    if inner is not None and inner.group(1).startswith(key + "."):
        key = inner.group(1)
    try:
        from omegaconf import DictConfig

        from astraflow.config import compose_config, unknown_key_message

        # without the override that failed (its key may be an alias: agent.x is workflow.x)
        rest = [a for a in argv if not a.split("=", 1)[0].lstrip("+~").endswith(
            overridden.rpartition(".")[2])]
        root = compose_config(rest)
        # the first part of the dotted key that is not there is the mistyped one
        # (`polices.policy.max_staleness`: polices)
        node, parts, depth = root, key.split("."), 0
        while depth < len(parts) and isinstance(node, DictConfig) and parts[depth] in node:
            node, depth = node[parts[depth]], depth + 1
        if depth == len(parts) or not isinstance(node, DictConfig):
            return None  # a setting that exists but refuses this value: Hydra's words
        return unknown_key_message(root, ".".join(parts[:depth + 1]), argv)
    except Exception:
        return None


def _unknown_option(exc: Exception) -> str | None:
    """Hydra's 'Could not find group/option' (a file-based group such as experiment) in
    one line with the options there are."""
    import difflib
    import re

    found = re.search(r"Could not find '([A-Za-z_]+)/([^']+)'", str(exc))
    if found is None:
        return None
    from astraflow.config import group_options

    group, option = found.groups()
    options = group_options(group)
    near = difflib.get_close_matches(option, options, n=1)
    return (f"{group}={option} is not an option; {group} has: {', '.join(options)}"
            + (f" (did you mean {near[0]}?)" if near else ""))


def config_error(exc: Exception, overrides: list[str]) -> str:
    """What Hydra or OmegaConf refused in composing ``overrides``, in the words the
    console prints after ``astraflow: config error:``."""
    said = _unknown_setting(exc, overrides) or _unknown_option(exc)
    if said:
        return said
    cause = exc.__cause__
    if cause is not None:  # "Error merging override X=Y": say why
        return f"{exc}: {str(cause).splitlines()[0]}"
    return str(exc)


def _bare_word(arg: str) -> bool:
    """An argument that is neither an option nor a Hydra override (``key=value``,
    ``~key``, ``+group=option``)."""
    return "=" not in arg and not arg.startswith(("-", "~", "+"))


def main(argv: list[str] | None = None) -> None:
    _load_subcommands()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in COMMANDS and _bare_word(argv[0]):
        # not a command, and no override either (an override has an '='): a typo
        import difflib

        near = difflib.get_close_matches(argv[0], [c for c in COMMANDS if c[0] != "_"], n=1)
        hint = f"did you mean '{near[0]}'? " if near else ""
        print(f"astraflow: unknown command '{argv[0]}': {hint}the commands are "
              f"{', '.join(sorted(c for c in COMMANDS if c[0] != '_'))}; a run takes "
              "overrides as key=value", file=sys.stderr)
        sys.exit(2)
    name = argv.pop(0) if argv and argv[0] in COMMANDS else "run"
    if name == "run" and ("-h" in argv or "--help" in argv):
        sys.exit(_help(argv))
    if name != "run":
        from astraflow.lifecycle import end_with_launcher

        end_with_launcher()
    try:
        code = COMMANDS[name](argv)
    except AstraFlowError as exc:
        print(f"astraflow: error: {exc}", file=sys.stderr)
        code = 2
    except Exception as exc:
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        if not isinstance(exc, HydraException | OmegaConfBaseException):
            raise
        # the overrides alone: Hydra's own flags (--cfg job) are not overrides to compose
        print(f"astraflow: config error: {config_error(exc, _hydra_flags(argv)[3])}",
              file=sys.stderr)
        code = 2
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
