"""The plugin API's promise, as its tools enforce it: a change that would break a plugin is
named, and a deprecated name warns its callers, naming what replaces it."""

from __future__ import annotations

import copy
import warnings

import pytest

from astraflow.api import breaks
from astraflow.deprecation import DEPRECATIONS, AstraFlowDeprecationWarning, deprecated

OLD = {"astraflow.contracts": {
    "Reward": {"bases": ["ABC"], "members": {"__call__": "(self, task, completion)",
                                             "inline": "attribute bool"}},
    "helper": {"signature": "(x, y=1)"},
}}


def _changed(edit):
    new = copy.deepcopy(OLD)
    edit(new["astraflow.contracts"])
    return new


def test_additions_break_nothing():
    new = _changed(lambda m: m["Reward"]["members"].update(aclose="async (self)"))
    new["astraflow.types"] = {"Task": {"bases": [], "members": {}}}
    assert breaks(OLD, new) == []


@pytest.mark.parametrize(("edit", "said"), [
    (lambda m: m["Reward"]["members"].pop("__call__"),
     "astraflow.contracts.Reward.__call__ is gone"),
    (lambda m: m["Reward"]["members"].update(__call__="(self, task)"),
     "astraflow.contracts.Reward.__call__: (self, task, completion) is now (self, task)"),
    (lambda m: m["helper"].update(signature="(x)"),
     "astraflow.contracts.helper: signature (x, y=1) is now (x)"),
    (lambda m: m.pop("helper"), "astraflow.contracts.helper is gone"),
])
def test_a_removed_or_changed_name_is_a_break(edit, said):
    assert breaks(OLD, _changed(edit)) == [said]


def test_a_deprecated_function_warns_its_caller_and_still_works():
    before = len(DEPRECATIONS)

    @deprecated(since="1.2", removed_in="2.0", instead="use new_total()")
    def old_total(a, b):
        return a + b

    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert old_total(2, 3) == 5
        (warning,) = seen
        assert warning.category is AstraFlowDeprecationWarning
        assert str(warning.message) == (
            f"{__name__}.test_a_deprecated_function_warns_its_caller_and_still_works."
            "<locals>.old_total is deprecated since astraflow 1.2 and goes in 2.0: use "
            "new_total()")
        assert warning.filename == __file__  # the caller's line, not the wrapper's
        # shown by default, unlike a DeprecationWarning raised in a plugin's module
        assert issubclass(AstraFlowDeprecationWarning, FutureWarning)
    finally:
        del DEPRECATIONS[before:]


def test_a_deprecated_class_warns_when_made():
    before = len(DEPRECATIONS)

    @deprecated(since="1.3", removed_in="2.0", instead="subclass Workflow")
    class OldBase:
        def __init__(self, x):
            self.x = x

    try:
        with pytest.warns(AstraFlowDeprecationWarning, match="OldBase is deprecated"):
            assert OldBase(4).x == 4
    finally:
        del DEPRECATIONS[before:]


@pytest.mark.parametrize("removed_in", ["1.4", "1.0", "2.1"])
def test_a_deprecation_is_removed_only_in_a_later_major_release(removed_in):
    with pytest.raises(ValueError, match=r"goes in a major release after 1\.3"):
        deprecated(since="1.3", removed_in=removed_in, instead="x")
