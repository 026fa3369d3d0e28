"""``reward=python``: a function in the user's own file, no package or plugin needed.

``reward.path=FILE reward.function=NAME`` (``score`` by default). The function takes
``(task, completion)``, or verl's custom-reward arguments ``(data_source, solution_str,
ground_truth, extra_info)`` so that reward files written for verl work unchanged. It
returns a float, a dict with ``"score"``, or an awaitable of either.

Every mistake in the file is found when the reward is built, and told in one line that
names the file (and the line where Python can tell): a reward that only fails on the
first sample would cost a cluster start-up to find out.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import traceback
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from astraflow.contracts import Reward
from astraflow.errors import ConfigError
from astraflow.rewards.base import RewardConfig
from astraflow.types import Task

#: verl's ``custom_reward_function`` arguments, all passed by keyword
VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


@dataclass
class PythonRewardConfig(RewardConfig):
    """``path`` is the Python file; ``function`` the name of the reward in it."""

    name: str = "python"
    path: str = ""
    function: str = "score"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _import_error(exc: BaseException, file: Path, key: str = "reward.path") -> ConfigError:
    """What went wrong importing ``file``, with the line in it where Python can tell."""
    kind = type(exc).__name__
    if isinstance(exc, SyntaxError):  # also one in a file it imports: name that file
        source = "" if not exc.filename or Path(exc.filename) == file else f"{exc.filename} "
        where = f"{source}line {exc.lineno}: " if exc.lineno else source
        return ConfigError(f"{key}={file} does not compile: {where}{kind}: {exc.msg}")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == file]
    where = f" (line {frames[-1].lineno})" if frames else ""
    return ConfigError(
        f"{key}={file} failed to import{where}: {kind}: {_one_line(str(exc))}"
    )


def load_module(file: Path, key: str = "reward.path") -> ModuleType:
    """``file`` imported as a module of its own, under a name no other file gets (two
    reward files both named ``reward.py`` must not replace each other). Its directory
    is importable while it loads, so it can import the files beside it. ``key`` is the
    setting that named the file, for the error messages."""
    stem = re.sub(r"\W", "_", file.stem)
    name = f"astraflow_user_reward_{stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{key}={file} is not a Python file Python can import")
    module = importlib.util.module_from_spec(spec)
    # registered before it runs, as an import would: dataclasses and pickle look it up
    sys.modules[name] = module
    directory = str(file.parent)
    sys.path.insert(0, directory)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not ours
            raise
        raise _import_error(exc, file, key) from exc
    finally:
        if directory in sys.path:
            sys.path.remove(directory)
    return module


def load_function(path: str, name: str, setting: str) -> tuple[Path, ModuleType, Any]:
    """``name`` from the Python file ``path``; every mistake is a one-line
    :class:`ConfigError` naming ``setting.path`` / ``setting.function``."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ConfigError(f"{setting}.path={path}: no such file ({file})")
    module = load_module(file, key=f"{setting}.path")
    if not hasattr(module, name):
        defined = _defined_callables(module)
        listed = ", ".join(defined) if defined else "no functions"
        raise ConfigError(f"{setting}.function={name} is not defined in {file}; it defines: "
                          f"{listed}")
    function = getattr(module, name)
    if not callable(function):
        raise ConfigError(f"{setting}.function={name} in {file} is a "
                          f"{type(function).__name__}, not a function")
    return file, module, function


def _defined_callables(module: ModuleType) -> list[str]:
    """The functions and classes the file itself defines, not the ones it imports."""
    return sorted(
        name
        for name, value in vars(module).items()
        if callable(value)
        and not name.startswith("__")
        and getattr(value, "__module__", None) == module.__name__
    )


def _verl_arguments(function: Any) -> tuple[str, ...] | None:
    """The verl arguments ``function`` takes, or None when it takes ``(task,
    completion)``: verl-style functions are recognised by naming ``solution_str``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):  # some builtins and C callables have no signature
        return None
    if "solution_str" not in parameters:
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return VERL_ARGS
    return tuple(name for name in VERL_ARGS if name in parameters)


class PythonReward(Reward):
    """Calls ``reward.function`` from ``reward.path`` and returns what it returns."""

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        path = str(getattr(config, "path", "") or "")
        name = str(getattr(config, "function", "") or "score")
        if not path:
            raise ConfigError("reward=python needs reward.path=FILE")
        self.file, self.module, self.function = load_function(path, name, "reward")
        self._verl = _verl_arguments(self.function)

    def __call__(self, task: Task, completion: str) -> Any:
        if self._verl is None:
            return self.function(task, completion)
        values = {
            "data_source": task.metadata.get("data_source", task.task_type),
            "solution_str": completion,
            "ground_truth": task.answer,
            "extra_info": task.metadata.get("extra_info", {}),
        }
        return self.function(**{name: values[name] for name in self._verl})
