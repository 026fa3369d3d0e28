"""Deprecating a public name (:mod:`astraflow.api`) before it changes.

A public function, method or class that is going away keeps working for at least one
minor release and warns each caller once, naming what to use instead and the release
it goes in; the break itself waits for the next major version::

    @deprecated(since="1.2", removed_in="2.0", instead="use Trajectory.reward")
    def old_reward(traj): ...

The warning is a :class:`FutureWarning`, which Python shows by default (a
``DeprecationWarning`` raised from a plugin's code would be hidden).
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T", bound=Callable[..., Any])


class AstraFlowDeprecationWarning(FutureWarning):
    """A public name a plugin uses is deprecated: the message says what replaces it."""


@dataclass(frozen=True)
class Deprecation:
    what: str
    since: str
    removed_in: str
    instead: str


#: every deprecation declared with :func:`deprecated` (checked against the version by the
#: plugin-API test: one due for removal fails it)
DEPRECATIONS: list[Deprecation] = []


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3])


def deprecated(*, since: str, removed_in: str, instead: str) -> Callable[[T], T]:
    """Mark a function, method or class deprecated in version ``since``; it goes in
    ``removed_in``, which must be a major release after ``since`` (x.0), so it warns
    for at least one minor release."""
    if _version(removed_in)[1:] not in ((), (0,), (0, 0)) or \
            _version(removed_in)[0] <= _version(since)[0]:
        raise ValueError(f"removed_in={removed_in}: a deprecated name goes in a major "
                         f"release after {since} (e.g. {_version(since)[0] + 1}.0)")

    def mark(obj: T) -> T:
        what = f"{obj.__module__}.{obj.__qualname__}"
        DEPRECATIONS.append(Deprecation(what, since, removed_in, instead))
        message = (f"{what} is deprecated since astraflow {since} and goes in "
                   f"{removed_in}: {instead}")
        if inspect.isclass(obj):
            init = obj.__init__

            @functools.wraps(init)
            def warned_init(self: Any, *args: Any, **kwargs: Any) -> None:
                warnings.warn(message, AstraFlowDeprecationWarning, stacklevel=2)
                init(self, *args, **kwargs)

            obj.__init__ = warned_init  # type: ignore[method-assign]
            return obj

        if inspect.iscoroutinefunction(obj):
            @functools.wraps(obj)
            async def warned_async(*args: Any, **kwargs: Any) -> Any:
                warnings.warn(message, AstraFlowDeprecationWarning, stacklevel=2)
                return await obj(*args, **kwargs)

            return warned_async  # type: ignore[return-value]

        @functools.wraps(obj)
        def warned(*args: Any, **kwargs: Any) -> Any:
            warnings.warn(message, AstraFlowDeprecationWarning, stacklevel=2)
            return obj(*args, **kwargs)

        return warned  # type: ignore[return-value]

    return mark
