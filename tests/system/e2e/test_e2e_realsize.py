"""Above the old limits: a checkpoint whose every version is larger than the data layer's
64 MB request limit trains end to end through each engine a CPU runs.

The checkpoint (:func:`astraflow.testing.models.make_sized_chat_model`, shape
``over-64mb``: a Qwen2 with a 64,000-row vocabulary, untied, 140 MB in bfloat16) is made
here. The reward is a uniform draw, so advantages are not all zero and every version
moves the weights: versions are whole snapshots or deltas of real updates, not copies of
the start. A transfer cut midway is resumed in ``tests/unit/weights/test_weights_chunked.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file

from astraflow.testing import launch_run, run_summary
from astraflow.testing.models import make_sized_chat_model

LIMIT = 64 * 2**20

REWARD = """import random


def score(task, completion):
    return random.random()
"""


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_sized_chat_model(tmp_path_factory.mktemp("over-64mb") / "model", "over-64mb")


@pytest.mark.slow
@pytest.mark.parametrize("raas", ["hf", "vllm"])
def test_versions_over_the_request_limit_train_and_load(raas: str, big_model: str,
                                                        tmp_path: Path) -> None:
    if raas == "vllm":
        pytest.importorskip("vllm")
    (tmp_path / "train.jsonl").write_text("".join(
        json.dumps({"prompt": f"{a}+{a}=", "answer": str(2 * a)}) + "\n" for a in range(32)))
    (tmp_path / "reward.py").write_text(REWARD)
    run_dir = tmp_path / "run"
    launch_run(tmp_path, f"model.path={big_model}", "task=jsonl",
               "task.train_files=[train.jsonl]", f"task.tokenizer={big_model}",
               "reward=python", "reward.path=reward.py", f"raas={raas}", "steps=3",
               "batch_size=8", "group_size=4", "workflow.max_new_tokens=4",
               f"run_dir={run_dir}")
    assert run_summary(run_dir)["policy"]["steps"] == 3
    store = run_dir / "store" / "weights" / "policy"
    manifests = [json.loads(p.read_text()) for p in sorted(store.glob("v*/manifest.json"))]
    assert manifests and all(m["model_bytes"] > LIMIT for m in manifests)
    assert manifests[-1]["version"] == 3
    # every version moved the weights, and the node served them as they came
    assert len({m["model_sha256"] for m in manifests}) == len(manifests)
    refreshes = [json.loads(line)
                 for line in (run_dir / "metrics" / "refresh-node-0.jsonl").open()]
    assert max(r["version"] for r in refreshes) >= 2, refreshes
    final = load_file(str(run_dir / "final" / "policy" / "model.safetensors"))
    start = load_file(f"{big_model}/model.safetensors")
    assert final.keys() == start.keys()
    assert any(not final[k].equal(start[k]) for k in start)  # the training moved them
