"""solve_select and solve_testgen on hand-written completions: who is rewarded for what,
and which tokens each policy trains on."""

from __future__ import annotations

import asyncio

import pytest
from omegaconf import OmegaConf

from astraflow.plugins import get_registry
from astraflow.tasks.functions import FunctionsConfig, FunctionTasks
from astraflow.testing.scripted import ScriptedPolicy
from astraflow.text import load_tokenizer
from astraflow.workflows.solve_select import SolveSelectConfig, SolveSelectWorkflow
from astraflow.workflows.solve_testgen import SolveTestgenConfig, SolveTestgenWorkflow


@pytest.fixture
def task():
    """f(x) = 2*x + 3 (the tests check f(3), f(4), f(5), f(6))."""
    tasks = FunctionTasks(FunctionsConfig(num_eval=0))
    (found,) = [t for t in tasks.train_tasks() if t.answer == "2*x+3"]
    assert found.prompt == "f(1)=5,f(2)=7,f(x)="
    return found


def code_reward():
    entry = get_registry().get("reward", "code")
    return entry.create(OmegaConf.structured(entry.config_cls))


def rollout(workflow, task, policies, group_size=1):
    trajs = asyncio.run(workflow.run(task, policies, group_size))
    for traj in trajs:
        traj.validate()
    return trajs


def spans(tok, traj):
    return [(s.source, tok.decode(traj.tokens[s.start:s.end])) for s in traj.spans]


def trained_text(tok, traj):
    return tok.decode([t for t, m in zip(traj.tokens, traj.loss_mask, strict=True) if m])


def test_the_selector_earns_what_its_pick_adds_over_a_random_pick(tiny_model_dir, task):
    tok = load_tokenizer(tiny_model_dir)
    workflow = SolveSelectWorkflow(SolveSelectConfig(candidates=4), tok, code_reward())
    solver = ScriptedPolicy("solver", tok, lambda ctx: ["2*x+5", "2*x+3", "x+4", "x*2+3"])
    picks = iter(["1", "2", "9"])
    selector = ScriptedPolicy("selector", tok, lambda ctx: next(picks))
    trajs = rollout(workflow, task, {"solver": solver, "selector": selector})
    solved = [t for t in trajs if t.policy == "solver"]
    # each candidate scored on the hidden tests: 2*x+5 and x+4 pass none (x+4 meets
    # 2x+3 only at x=1), the other two all four
    assert [t.reward for t in solved] == [0.0, 1.0, 0.0, 1.0]
    for traj in solved:
        assert spans(tok, traj)[0] == ("prompt", task.prompt)
        assert traj.outcome.metrics["selected"] == 1.0
    (picked,) = [t for t in trajs if t.policy == "selector"]
    # it picked a right one: 1.0 against a random pick's 0.5
    assert picked.reward == pytest.approx(0.5)
    assert trained_text(tok, picked).startswith("1")
    assert tok.decode(picked.tokens).startswith(
        "f(1)=5,f(2)=7,f(x)=\n0:2*x+5\n1:2*x+3\n2:x+4\n3:x*2+3\npick:1")
    # the candidates are the selector's context, never trained by it
    assert [s for s, _ in spans(tok, picked)].count("solver") == 4
    # a wrong pick costs what a random pick would have won; an unreadable pick is the
    # worst candidate
    for expected in (-0.5, -0.5):
        (wrong,) = [t for t in rollout(workflow, task, {"solver": solver,
                                                        "selector": selector})
                    if t.policy == "selector"]
        assert wrong.reward == pytest.approx(expected)


def test_a_pick_among_equal_candidates_earns_nothing(tiny_model_dir, task):
    tok = load_tokenizer(tiny_model_dir)
    workflow = SolveSelectWorkflow(SolveSelectConfig(candidates=2), tok, code_reward())
    solver = ScriptedPolicy("solver", tok, lambda ctx: "2*x+3")
    selector = ScriptedPolicy("selector", tok, lambda ctx: "0")
    trajs = rollout(workflow, task, {"solver": solver, "selector": selector}, group_size=3)
    assert [t.reward for t in trajs if t.policy == "selector"] == [0.0] * 3
    assert [t.reward for t in trajs if t.policy == "solver"] == [1.0] * 6


def test_the_tester_earns_valid_tests_that_catch_wrong_code(tiny_model_dir, task):
    tok = load_tokenizer(tiny_model_dir)
    workflow = SolveTestgenWorkflow(SolveTestgenConfig(candidates=2), tok, code_reward())
    tests = iter(["f(4)==11", "f(0)==3", "f(4)==12", "hello("])
    tester = ScriptedPolicy("tester", tok, lambda ctx: next(tests))
    # one right candidate, one wrong one that still agrees with f at x=0
    solver = ScriptedPolicy("solver", tok, lambda ctx: ["2*x+3", "x+3"])
    results = [rollout(workflow, task, {"solver": solver, "tester": tester})
               for _ in range(4)]
    rewards = [next(t.reward for t in trajs if t.policy == "tester") for trajs in results]
    # valid and catches the wrong candidate; valid but x+3 passes it; wrong on the
    # reference; not Python
    assert rewards == [1.0, 0.5, 0.0, 0.0]
    trajs = results[0]
    for traj in trajs:
        if traj.policy == "solver":  # the tests are context above the problem
            assert spans(tok, traj)[:3] == [("tester", "f(4)==11"), ("prompt", "\n"),
                                            ("prompt", task.prompt)]
            assert trained_text(tok, traj).startswith(("2*x+3", "x+3"))
        else:
            assert tok.decode(traj.tokens).startswith(task.prompt + "\ntest:f(4)==11")
            assert trained_text(tok, traj).startswith("f(4)==11")
    # the solver is graded by the hidden tests, not by the generated ones
    assert sorted(t.reward for t in trajs if t.policy == "solver") == [0.0, 1.0]
    assert trajs[-1].outcome.metrics["tests_valid"] == 1.0


def test_a_hung_candidate_is_caught_by_the_sandbox_not_the_node(tiny_model_dir, task):
    tok = load_tokenizer(tiny_model_dir)
    config = SolveTestgenConfig(candidates=1)
    config.sandbox.timeout = 2.0
    workflow = SolveTestgenWorkflow(config, tok, code_reward())
    tester = ScriptedPolicy("tester", tok, lambda ctx: "f(4)==11")
    # a "solution" that never returns, to the generated tests and to the hidden ones
    solver = ScriptedPolicy("solver", tok, lambda ctx: "max(iter(int,1))")
    trajs = rollout(workflow, task, {"solver": solver, "tester": tester})
    (solved,) = [t for t in trajs if t.policy == "solver"]
    assert solved.reward == 0.0
    (tested,) = [t for t in trajs if t.policy == "tester"]
    assert tested.reward == 1.0  # a valid test that rejected hung code
