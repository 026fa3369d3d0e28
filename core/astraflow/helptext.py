"""What ``python -m astraflow --help`` prints: the commands, every config group with its
installed options and where each came from, and the run's settings; ``--help TOPIC``
shows one group (``--help raas``), one option's settings with defaults and docs
(``--help raas=vllm``), or one section (``--help model``)."""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
import typing
from importlib import resources
from typing import Any

from astraflow import __version__
from astraflow.errors import ConfigError
from astraflow.fielddocs import field_docs

USAGE = """\
usage: python -m astraflow [OVERRIDES...]          run a job on this machine
       python -m astraflow COMMAND [ARGS...]       a command (COMMAND --help for its own)
       python -m astraflow --help [TOPIC]          this text, or one group / option / section
       python -m astraflow --cfg job [OVERRIDES]   print the composed config and exit

Overrides are Hydra's: GROUP=OPTION picks an option (raas=vllm, also +raas=vllm),
KEY=VALUE sets a setting (steps=20 trainer.lr=1e-4), +experiment=NAME applies a preset."""


def class_doc(cls: type) -> str:
    """A class's docstring, not the signature dataclasses make up for one without."""
    doc = inspect.getdoc(cls) or ""
    return "" if doc.startswith(cls.__name__ + "(") else doc


def _type_name(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "(required)"


def settings_table(cls: type, prefix: str = "", depth: int = 1,
                   skip: tuple[str, ...] = ()) -> list[str]:
    """One line per setting of the dataclass ``cls``: ``key: type = default  -- doc``;
    nested dataclasses are expanded ``depth`` levels, deeper ones named."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        hint: Any = hints.get(f.name, f.type)
        key = f"{prefix}{f.name}"
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            doc = docs.get(f.name) or class_doc(hint).split("\n")[0]
            if depth > 0:
                out.append(f"  {key}:" + (f"  -- {doc}" if doc else ""))
                out += settings_table(hint, f"{key}.", depth - 1)
            else:
                out.append(f"  {key}.*  -- {doc} (--help {key})")
            continue
        line = f"  {key}: {_type_name(hint)} = {_default(f)!r}"
        note = docs.get(f.name)
        out.append(f"{line}  -- {note}" if note else line)
    return out


def _file_options(group: str) -> dict[str, str]:
    folder = resources.files("astraflow.conf") / group
    if not folder.is_dir():
        return {}
    return {p.name[:-5]: f"conf/{group}/{p.name}" for p in folder.iterdir()
            if p.name.endswith(".yaml")}


def _schema_options(group: str) -> dict[str, type]:
    """The core's own options of a group that no plugin provides (the launchers)."""
    from astraflow.launcher_options import LAUNCHERS

    return dict(LAUNCHERS) if group == "launcher" else {}


def _file_summary(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#") and not line.startswith("# @package"):
            return line.lstrip("#").strip()
    return ""


def group_lines(group: str) -> list[str]:
    """Each option of ``group``: name, where it came from, and what it is."""
    from astraflow.config import DEFAULT_OPTIONS
    from astraflow.plugins import get_registry

    out = []
    for name, entry in sorted(get_registry().group_options(group).items()):
        mark = " (default)" if DEFAULT_OPTIONS.get(group) == name else ""
        source = f"{entry.distribution} {entry.version}"
        out.append(f"    {name}{mark}  [{source}]" +
                   (f"  {entry.description}" if entry.description else ""))
    for name, cls in sorted(_schema_options(group).items()):
        mark = " (default)" if DEFAULT_OPTIONS.get(group) == name else ""
        summary = class_doc(cls).split("\n")[0]
        out.append(f"    {name}{mark}  [astraflow {__version__}]" +
                   (f"  {summary}" if summary else ""))
    for name, path in sorted(_file_options(group).items()):
        mark = " (default)" if DEFAULT_OPTIONS.get(group) == name else ""
        text = (resources.files("astraflow.conf") / path.removeprefix("conf/")).read_text()
        summary = _file_summary(text)
        out.append(f"    {name}{mark}  [{path}]" + (f"  {summary}" if summary else ""))
    return out


def overview(commands: dict[str, Any]) -> str:
    from astraflow.config import GROUPS, AstraFlowConfig

    lines = [USAGE, "", "Commands:"]
    for name, fn in sorted(commands.items()):
        if name.startswith("_"):  # internal: started by the launcher
            continue
        doc = (inspect.getdoc(fn) or "").split("\n")[0]
        lines.append(f"  {name:10} {doc}")
    lines += ["", "Config groups (GROUP=OPTION; --help GROUP=OPTION shows its settings):"]
    for group in GROUPS:
        lines.append(f"  {group}:")
        lines += group_lines(group) or ["    (none installed)"]
    lines += ["", "Settings (KEY=VALUE; sections: --help model, --help dataflow, ...):"]
    lines += settings_table(AstraFlowConfig, depth=0, skip=GROUPS)
    return "\n".join(lines)


def topic(spec: str) -> str:
    """``--help GROUP``, ``--help GROUP=OPTION`` or ``--help SECTION``."""
    from astraflow.config import GROUPS, AstraFlowConfig
    from astraflow.plugins import MULTI_GROUPS, get_registry

    group, _, option = spec.lstrip("+").partition("=")
    if group in GROUPS and not option:
        return "\n".join([f"{group}: pick one with {group}=OPTION", *group_lines(group)])
    if group in GROUPS:
        entry = get_registry().group_options(group).get(option)
        if entry is not None:
            head = [f"{group}={option}  [{entry.distribution} {entry.version}]"]
            if entry.description:
                head.append(f"  {entry.description}")
            if entry.config_cls is None:
                return "\n".join([*head, "  (no settings)"])
            doc = class_doc(entry.config_cls)
            if doc:
                head += ["", textwrap.indent(doc, "  ")]
            prefix = f"{group}.{option}." if group in MULTI_GROUPS else f"{group}."
            return "\n".join([*head, "", "Settings:",
                              *settings_table(entry.config_cls, prefix)])
        schema = _schema_options(group).get(option)
        if schema is not None:
            return "\n".join([f"{group}={option}  [astraflow {__version__}]", "",
                              textwrap.indent(class_doc(schema), "  "), "", "Settings:",
                              *settings_table(schema, f"{group}.")])
        path = _file_options(group).get(option)
        if path is not None:
            text = (resources.files("astraflow.conf") / path.removeprefix("conf/")).read_text()
            return f"{group}={option}  [{path}]\n\n" + textwrap.indent(text.rstrip(), "  ")
        import difflib

        from astraflow.config import group_options

        options = group_options(group)
        near = difflib.get_close_matches(option, options, n=1)
        raise ConfigError(f"--help {spec}: {group} has no option {option!r}"
                          + (f" (did you mean {group}={near[0]}?)" if near else "")
                          + f"; it has: {', '.join(options)}")
    hints = typing.get_type_hints(AstraFlowConfig)
    if spec in hints and dataclasses.is_dataclass(hints[spec]):
        doc = class_doc(hints[spec]).split("\n")[0]
        return "\n".join([f"{spec}: {doc}", *settings_table(hints[spec], f"{spec}.")])
    if spec in hints:
        return "\n".join(line for line in settings_table(AstraFlowConfig, depth=0)
                         if line.startswith(f"  {spec}:"))
    import difflib

    near = difflib.get_close_matches(spec, [*GROUPS, *hints], n=1)
    raise ConfigError(f"--help {spec}: not a group, option or setting"
                      + (f" (did you mean {near[0]}?)" if near else "")
                      + f"; groups: {', '.join(GROUPS)}")
