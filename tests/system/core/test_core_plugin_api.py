"""The plugin API (``astraflow.api.PUBLIC``) holds between releases: what a plugin written
for this major version imports, subclasses or calls is still there, with the same shape.

A deliberate break bumps the major version, records the new surface
(``python -m astraflow.api --write``), writes a changelog entry and updates the frozen
plugin packages of the compatibility suite (tests/compat) in the same commit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from packaging.version import Version

from astraflow import __version__
from astraflow.api import breaks, snapshot_path, surface
from astraflow.deprecation import DEPRECATIONS

ROOT = Path(__file__).resolve().parents[3]
MAJOR = int(__version__.split(".")[0])


def test_nothing_a_plugin_relies_on_is_gone_or_changed():
    recorded = json.loads(snapshot_path(MAJOR).read_text())
    broken = breaks(recorded, surface())
    assert not broken, (
        f"these changes break plugins written for astraflow {MAJOR}.x: "
        + "; ".join(broken) + ". Keep the old name working (astraflow.deprecation) until "
        f"{MAJOR + 1}.0, or make this release {MAJOR + 1}.0 with a changelog entry")


def test_the_recorded_surface_is_this_versions():
    """Additions are recorded too, so the next release's promise includes them."""
    recorded = json.loads(snapshot_path(MAJOR).read_text())
    assert recorded == surface(), (
        f"the public surface grew or changed since {snapshot_path(MAJOR).name} was "
        "written: record it with `python -m astraflow.api --write` (a minor release "
        "if it only adds)")


def test_the_changelog_names_this_version():
    changelog = (ROOT / "docs" / "changelog.md").read_text()
    versions = re.findall(r"^## (\d+\.\d+\.\d+)", changelog, re.M)
    assert __version__ in versions, f"docs/changelog.md has no '## {__version__}' entry"


def test_no_deprecated_name_outlives_its_removal_release():
    surface()  # every public module imported: each declares its deprecations
    due = [d for d in DEPRECATIONS if Version(__version__) >= Version(d.removed_in)]
    assert not due, f"deprecated names due for removal in {__version__}: {due}"


def test_a_parameter_added_with_a_default_breaks_nothing():
    """Calls written for the old signature still work; any other change breaks them."""
    from astraflow.api import extends

    was = "(logits: 'Tensor', tokens: 'Tensor') -> 'Tensor'"
    assert extends(was, "(logits: 'Tensor', tokens: 'Tensor', start: 'int' = 0) -> 'Tensor'")
    assert extends("() -> None", "(x=1, **kwargs) -> None")
    assert not extends(was, "(logits: 'Tensor', tokens: 'Tensor', start: 'int') -> 'Tensor'")
    assert not extends(was, "(logits: 'Tensor', start: 'int' = 0) -> 'Tensor'")
    assert not extends(was, "(logits: 'Tensor', tokens: 'Tensor', start=0) -> 'int'")
    old = {"m": {"f": {"kind": "function", "signature": was}}}
    now = "(logits: 'Tensor', tokens: 'Tensor') -> 'int'"
    assert breaks(old, {"m": {"f": {"kind": "function", "signature": now}}})
