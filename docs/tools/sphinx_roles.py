"""A griffe extension for the API reference: Sphinx roles in docstrings become links.

The core's docstrings cross-reference with Sphinx roles (``:class:`~astraflow.x.Y```),
which Markdown would print as they are. At build time each role becomes a code span
wrapped in an optional cross-reference: a link where the target is rendered in the
reference, plain code where it is not (an internal module), never a broken link.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`(~?)([^`]+)`")


def _link(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2).strip()
    if "<" in target and target.endswith(">"):  # :class:`title <target>`
        title, target = (s.strip() for s in target[:-1].split("<", 1))
    else:
        title = target.rsplit(".", 1)[-1] if short else target
    return (f'<autoref identifier="{html.escape(target)}" optional>'
            f"<code>{html.escape(title)}</code></autoref>")


class SphinxRoles(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_link, obj.docstring.value)
