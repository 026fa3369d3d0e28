"""Router replay on a mixture-of-experts model: the engine records the experts each
layer routed every token to, the trajectory carries them, and the trainer routes as the
engine did -- so a token's log-prob is computed by the network that sampled it.

The engine here computes in bfloat16 and the trainer in float32, as on a GPU cluster,
over a copy of the tiny Qwen3-MoE whose routers score their experts closely (what a
trained router often does): there the two precisions choose different experts for some
tokens."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from chat_rows import problems, write_jsonl

from astraflow.testing import launch_run, run_summary
from astraflow.testing.moe import close_router_copy, sampled, step


def test_replay_routes_the_trainer_as_the_engine_did(tmp_path, moe_model_dir):
    model = close_router_copy(moe_model_dir, tmp_path / "close")
    items = sampled(model)
    never_ran = 0
    for item in items:  # every position of prompt and answer, each of four experts...
        routed = item.trajectory.routed_experts
        assert routed is not None and (routed.layers, routed.top_k) == (2, 2)
        assert routed.positions == len(item.trajectory.tokens)
        assert max(routed.experts[:-4]) < 4
        # ...but the last token of the longest answer of a batch: no step ran it
        never_ran += routed.experts[-4:] == bytes([255] * 4)
    assert 1 <= never_ran < len(items)
    plain, replayed = step(model, items, replay=False), step(model, items, replay=True)
    # the trainer's own routers choose otherwise for some tokens in float32...
    assert plain["routing_mismatch"] > 0 and replayed["routing_mismatch"] > 0
    # ...without replay it routes them so; with replay never
    assert plain["routing_difference"] == plain["routing_mismatch"]
    assert replayed["routing_difference"] == 0
    # and the log-prob gap the flipped tokens caused is gone
    assert replayed["rollout_logprob_gap_max"] < plain["rollout_logprob_gap_max"]
    assert replayed["rollout_logprob_gap_fresh"] < plain["rollout_logprob_gap_fresh"]


def test_replay_leaves_a_forward_that_routed_alike_unchanged(moe_model_dir):
    """Same precision on both sides: nothing differs, and replaying the trainer's own
    choices gives its own log-probs (the router's weighing is reproduced exactly)."""
    items = sampled(moe_model_dir, dtype="float32")
    plain, replayed = step(moe_model_dir, items, False), step(moe_model_dir, items, True)
    assert plain["routing_mismatch"] == replayed["routing_difference"] == 0
    assert replayed["rollout_logprob_gap_max"] == plain["rollout_logprob_gap_max"] < 1e-5
    assert replayed["loss"] == plain["loss"]


@pytest.mark.slow
def test_a_run_with_router_replay_trains_on_the_engines_routing(tmp_path, moe_model_dir):
    train, _ = problems()
    write_jsonl(tmp_path / "train.jsonl", train)
    run_dir = tmp_path / "run"
    model = close_router_copy(moe_model_dir, tmp_path / "close")
    launch_run(tmp_path, f"model.path={model}", "task=jsonl", "task.train_files=[train.jsonl]",
               "task.eval_size=8", "raas=hf", "raas.dtype=bfloat16", "trainer=hf",
               "trainer.router_replay=true", "+experiment=smoke", "steps=3",
               f"run_dir={run_dir}")
    assert run_summary(run_dir)["policy"]["steps"] == 3
    train_log = [json.loads(line)
                 for line in (run_dir / "metrics" / "train-policy.jsonl").open()]
    assert len(train_log) == 3
    for record in train_log:  # every step's samples carried their routing, replayed
        assert record["train/routing_difference"] == 0
        assert 0 <= record["train/routing_mismatch"] < 0.5


def test_router_replay_is_refused_where_nothing_can_be_replayed(tmp_path, moe_model_dir,
                                                                 chat_model_dir):
    def refused(*overrides: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "astraflow", "trainer.router_replay=true",
             f"run_dir={tmp_path / 'run'}", "steps=1", *overrides],
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode != 0
        assert not (tmp_path / "run").exists()  # before anything started
        return proc.stderr.strip().splitlines()[-1]

    said = refused()  # the built-in tiny model
    assert said == ("astraflow: error: trainer.router_replay=true: the built-in tiny model has "
                    "no mixture-of-experts layer to replay; give model.path=<an MoE checkpoint>")
    said = refused(f"model.path={chat_model_dir}")
    assert said == (f"astraflow: error: trainer.router_replay=true: {chat_model_dir} is not a "
                    "mixture-of-experts model (its config.json counts no experts); there is "
                    "no routing to replay")
    # vLLM returns routed experts only from its model runner V2, which needs Triton
    engines = ["sim", "vllm"] if importlib.util.find_spec("vllm") else ["sim"]
    for raas in engines:
        said = refused(f"model.path={moe_model_dir}", f"raas={raas}")
        assert said == (f"astraflow: error: trainer.router_replay=true: raas={raas} does not "
                        "record the experts it routes each token to; use raas=hf")
