"""The API reference (docs/reference/) renders every public name of the plugin API
(astraflow.api.PUBLIC): a name added to the promise gets its page entry too."""

from __future__ import annotations

import re
from pathlib import Path

from astraflow.api import PUBLIC

ROOT = Path(__file__).resolve().parents[3]
DIRECTIVE = re.compile(r"^::: ([\w.]+)\n((?:[ \t]+.*\n)*)", re.M)


def documented(pages: list[str]) -> dict[str, set[str] | None]:
    """Each `::: identifier` of the pages -> the members it lists (None: all of them)."""
    out: dict[str, set[str] | None] = {}
    for text in pages:
        for ident, options in DIRECTIVE.findall(text):
            members = re.findall(r"^\s+- (\w+)\s*$", options, re.M)
            out[ident] = set(members) if members else None
    return out


def missing(pages: list[str]) -> list[str]:
    docs = documented(pages)
    out = []
    for module, names in PUBLIC.items():
        if module == "astraflow":  # hookimpl and __version__: the plugin pages say them
            continue
        for name in names:
            if f"{module}.{name}" in docs or (module in docs and docs[module] is None):
                continue
            listed = set().union(*(m or set() for ident, m in docs.items()
                                   if ident == module or ident.startswith(module + ".")))
            if name not in listed:
                out.append(f"{module}.{name}")
    return out


def reference_pages() -> list[str]:
    return [p.read_text() for p in sorted((ROOT / "docs" / "reference").glob("*.md"))]


def test_every_public_name_of_the_plugin_api_is_in_the_reference():
    assert missing(reference_pages()) == []


def test_a_public_name_left_out_of_a_page_is_found():
    pages = [p.replace("        - policy_loss\n", "") for p in reference_pages()]
    assert missing(pages) == ["astraflow.rl.losses.policy_loss"]
