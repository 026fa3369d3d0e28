"""GRESO's skip rule and adaptation against hand-computed values."""

from __future__ import annotations

import pytest
from astraflow_data_greso import GresoConfig
from astraflow_data_greso.greso import Greso

from astraflow.types import Task

T = Task("t1", "1+1=", "2")


def test_a_task_with_variance_is_always_issued():
    g = Greso()
    g.observe_group(T, "policy", [1.0, 0.0, 1.0, 0.0])
    assert g.skip_probability("t1") == 0.0
    assert all(g.should_issue(T) for _ in range(200))


def test_skip_probability_follows_p_to_the_z_with_floors():
    g = Greso()
    for z in range(1, 5):  # all-correct groups: easy, p=0.5, floor 0.10
        g.observe_group(T, "policy", [1.0] * 8)
        assert g.skip_probability("t1") == pytest.approx(1 - max(0.5**z, 0.10))
    g.observe_group(T, "policy", [1.0, 0.0])  # variance resets z
    assert g.skip_probability("t1") == 0.0
    for z in range(1, 4):  # all-wrong groups: hard, floor 0.40
        g.observe_group(T, "policy", [0.0] * 8)
        assert g.skip_probability("t1") == pytest.approx(1 - max(0.5**z, 0.40))


def test_issue_frequency_matches_the_probability():
    g = Greso()
    for _ in range(2):
        g.observe_group(T, "policy", [1.0] * 4)  # z=2, easy: issue with 0.25
    issued = sum(g.should_issue(T) for _ in range(20000))
    assert issued / 20000 == pytest.approx(0.25, abs=0.015)


def test_adaptation_waits_for_warm_up_then_moves_by_one_hundredth():
    g = Greso()
    a, b, c = (Task(f"t{i}", "", "") for i in range(3))
    g.observe_group(a, "policy", [1.0] * 4)  # easy zero-variance
    g.observe_group(b, "policy", [0.0, 1.0])
    g.on_new_version("policy", 1)
    assert g.p == {"easy": 0.5, "hard": 0.5}  # not warmed up: one pass not complete
    g.observe_group(a, "policy", [1.0] * 4)  # seen again: warmed up
    g.observe_group(b, "policy", [0.0, 1.0])
    g.observe_group(c, "policy", [1.0, 0.0])
    g.on_new_version("policy", 2)
    # easy ratio 1/3 >= 0.083 -> p_easy - 0.01; hard ratio 0 < 0.167 -> p_hard + 0.01
    assert g.p == pytest.approx({"easy": 0.49, "hard": 0.51})
    for _ in range(10):
        g.observe_group(c, "policy", [0.0] * 4)
        g.on_new_version("policy", 3)
    assert g.p["hard"] == pytest.approx(0.41)


def test_probabilities_are_clamped():
    g = Greso(GresoConfig(p_init=0.985))
    g.warmed_up = True
    for v in range(5):
        g.observe_group(T, "policy", [0.0, 1.0])
        g.on_new_version("policy", v)
    assert g.p == {"easy": 0.99, "hard": 0.99}


def test_state_round_trips_through_json():
    import json

    g = Greso()
    for _ in range(3):
        g.observe_group(T, "policy", [0.0] * 4)
    restored = Greso()
    restored.load_state_dict(json.loads(json.dumps(g.state_dict())))
    assert restored.skip_probability("t1") == g.skip_probability("t1")
    assert [restored.should_issue(T) for _ in range(50)] == [g.should_issue(T) for _ in range(50)]


def test_only_the_configured_policy_drives_selection():
    g = Greso(GresoConfig(policy="solver"))
    g.observe_group(T, "verifier", [1.0] * 4)
    assert g.skip_probability("t1") == 0.0
    g.observe_group(T, "solver", [1.0] * 4)
    assert g.skip_probability("t1") == pytest.approx(0.5)
