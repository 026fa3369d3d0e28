"""solve_verify's credit: the solver's first answer, its retry and the verifier's
verdicts are rewarded, grouped and masked as the workflow promises."""

from __future__ import annotations

import asyncio

from astraflow.rewards.exact_match import ExactMatch
from astraflow.testing.scripted import ScriptedPolicy
from astraflow.text import load_tokenizer
from astraflow.types import Task
from astraflow.workflows.solve_verify import SolveVerifyConfig, SolveVerifyWorkflow


def run(tiny_model_dir, solver_reply, verifier_reply, group_size=4, **config):
    tok = load_tokenizer(tiny_model_dir)
    workflow = SolveVerifyWorkflow(SolveVerifyConfig(**config), tok, ExactMatch())
    policies = {"solver": ScriptedPolicy("solver", tok, solver_reply),
                "verifier": ScriptedPolicy("verifier", tok, verifier_reply)}
    trajs = asyncio.run(workflow.run(Task("t1", "12+7=", "19"), policies, group_size))
    for traj in trajs:
        traj.validate()
    return tok, trajs


def texts(tok, traj):
    """(source, text) of every span."""
    return [(s.source, tok.decode(traj.tokens[s.start:s.end])) for s in traj.spans]


def test_a_rejected_wrong_answer_gets_a_retry_that_alone_earns_the_fix(tiny_model_dir):
    # wrong first answer, the verifier rejects it, the retry is right
    tok, trajs = run(tiny_model_dir, lambda ctx: "19" if ctx.endswith(":n=") else "18",
                     lambda ctx: "n", group_size=2)
    first = [t for t in trajs if t.policy == "solver" and t.metadata.get("eval", True)]
    retries = [t for t in trajs if t.policy == "solver" and not t.metadata.get("eval", True)]
    assert len(first) == 2 and len(retries) == 2
    for traj in first:  # the solver's own answer, judged alone: wrong
        assert traj.reward == 0.0 and traj.group_id == "t1"
        assert traj.outcome.metrics == {"first_answer": 0.0, "final_answer": 1.0,
                                        "retried": 1.0, "fixed": 1.0, "broke": 0.0}
    for traj in retries:  # judged against the task's first answers
        assert traj.reward == 1.0 and traj.group_id == "t1"
        spans = texts(tok, traj)
        assert [s for s, _ in spans] == ["prompt", "earlier", "prompt", "verifier", "prompt",
                                         "solver"]
        assert "".join(text for _, text in spans[:-1]) == "12+7=18:n="
        # only the retried answer is trained
        trained = [i for i, m in enumerate(traj.loss_mask) if m]
        assert tok.decode([traj.tokens[i] for i in trained]).startswith("19")
    # every verdict was on a wrong answer: nothing to balance against, none trained
    assert not [t for t in trajs if t.policy == "verifier"]
    # or against the task's other retries only
    _, trajs = run(tiny_model_dir, lambda ctx: "19" if ctx.endswith(":n=") else "18",
                   lambda ctx: "n", group_size=2, retry_group="retries")
    assert sorted(t.group_id for t in trajs) == ["t1", "t1", "t1/retry", "t1/retry"]


def test_the_verifier_trains_only_on_groups_with_right_and_wrong_answers(tiny_model_dir):
    calls = {"n": 0}

    def solver(ctx):  # one right answer in four
        calls["n"] += 1
        return "19" if calls["n"] == 1 else "17"

    tok, trajs = run(tiny_model_dir, solver, lambda ctx: "n", retry=False)
    verdicts = [t for t in trajs if t.policy == "verifier"]
    # the right answer wrongly rejected, three wrong ones rightly
    assert sorted(t.reward for t in verdicts) == [0.0, 1.0, 1.0, 1.0]
    # per class, for the verifier's balanced accuracy
    assert sorted(str(t.outcome.metrics) for t in verdicts) == [
        "{'accept_right': 0.0}", *["{'reject_wrong': 1.0}"] * 3]
    assert sorted(t.metadata["answer_right"] for t in verdicts) == [False, False, False, True]
    for traj in verdicts:
        spans = texts(tok, traj)
        assert [s for s, _ in spans] == ["prompt", "solver", "prompt", "verifier"]
        assert sum(traj.loss_mask) == traj.spans[-1].end - traj.spans[-1].start
    # only wrong answers: "n" is all there is to learn, so nothing is trained...
    _, trajs = run(tiny_model_dir, lambda ctx: "17", lambda ctx: "n", retry=False)
    assert not [t for t in trajs if t.policy == "verifier"]
    # ...unless balancing is off
    _, trajs = run(tiny_model_dir, lambda ctx: "17", lambda ctx: "n", retry=False,
                   balance_verifier=False)
    assert [t.reward for t in trajs if t.policy == "verifier"] == [1.0] * 4


def test_an_accepted_answer_is_not_retried_and_the_pair_accuracy_is_the_first(tiny_model_dir):
    _, trajs = run(tiny_model_dir, lambda ctx: "19", lambda ctx: "y")
    assert [t.policy for t in trajs] == ["solver"] * 4  # all right: no verdict to balance
    for traj in trajs:
        assert traj.reward == 1.0
        assert traj.outcome.metrics["final_answer"] == 1.0


def test_warmstart_covers_answers_verdicts_and_retries():
    tasks = [Task("a", "1+2=", "3")]
    prompts = {t.prompt: t.answer for t in SolveVerifyWorkflow.warmstart_tasks(tasks)}
    assert prompts["1+2="] == "3" and prompts["1+2=3:"] == "y"
    wrong = [p for p, a in prompts.items() if a == "n"]
    assert len(wrong) == 1 and prompts[wrong[0].replace(":", ":n=")] == "3"


def test_a_task_that_lists_wrong_answers_warm_starts_the_verifier_on_them():
    tasks = [Task("s", "6,9,7,3 to 10=", "7+3", metadata={"wrong": ["6+7", "9+7"]}),
             Task("only", "1,2 to 3=", "1+2", metadata={"wrong": []})]
    examples = SolveVerifyWorkflow.warmstart_tasks(tasks)
    prompts = {t.prompt: t.answer for t in examples}
    rejected = [p for p, a in prompts.items() if a == "n"]
    assert len(rejected) == 1 and rejected[0].removeprefix("6,9,7,3 to 10=") in ("6+7:", "9+7:")
    assert prompts[rejected[0].replace(":", ":n=")] == "7+3"
    # no wrong answer listed: the right one is shown, nothing is made up
    assert prompts["1,2 to 3=1+2:"] == "y" and not any(p.startswith("1,2 to 3=") and a == "n"
                                                     for p, a in prompts.items())


def test_with_more_retries_each_rejected_retry_is_judged_and_tried_again(tiny_model_dir):
    """retries=3: 18 is rejected, the retry 17 is judged and rejected too, the next retry
    (shown 17, the latest rejection) is 19, accepted, and the pair's final answer is
    right; a retry the verifier accepts is the last."""
    def solver(ctx):
        return {"12+7=18:n=": "17", "12+7=17:n=": "19"}.get(ctx, "18")

    tok, trajs = run(tiny_model_dir, solver, lambda ctx: "y" if ctx == "12+7=19:" else "n",
                     group_size=1, retries=3)
    retries = [t for t in trajs if t.policy == "solver" and not t.metadata.get("eval", True)]
    assert [t.reward for t in retries] == [0.0, 1.0]
    assert ["".join(text for _, text in texts(tok, t)[:-1]) for t in retries] == [
        "12+7=18:n=", "12+7=17:n="]
    (first,) = [t for t in trajs if t.policy == "solver" and t.metadata.get("eval", True)]
    assert first.outcome.metrics == {"first_answer": 0.0, "final_answer": 1.0,
                                     "retried": 1.0, "fixed": 1.0, "broke": 0.0}
    # the first answer keeps its own verdict, not the accepted retry's
    assert first.metadata["verdict"] == "n"
    # the verifier takes the retry 17: no further retry, the final answer is wrong
    tok, trajs = run(tiny_model_dir, solver, lambda ctx: "y" if ctx == "12+7=17:" else "n",
                     group_size=1, retries=3)
    retries = [t for t in trajs if t.policy == "solver" and not t.metadata.get("eval", True)]
    assert [t.reward for t in retries] == [0.0]
    (first,) = [t for t in trajs if t.policy == "solver" and t.metadata.get("eval", True)]
    assert first.outcome.metrics["final_answer"] == 0.0
