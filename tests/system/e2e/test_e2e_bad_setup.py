"""A set-up mistake stops the run before anything starts, in one line naming what and
where; a component that dies before it ever worked is not restarted."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def launch(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "astraflow", f"run_dir={tmp_path / 'run'}",
         "launcher.progress=false", *overrides],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)


def refused(proc: subprocess.CompletedProcess, tmp_path: Path) -> str:
    """The one line the user reads; nothing was started or written."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("astraflow: error: ")
    assert not (tmp_path / "run").exists()
    return lines[0]


@pytest.fixture
def rows(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "train.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                            for i in range(20)))
    return path


def test_a_missing_dataset_file(tmp_path, tiny_model_dir):
    line = refused(launch(tmp_path, "task=jsonl", "task.train_files=[data/nope.jsonl]",
                          f"model.path={tiny_model_dir}"), tmp_path)
    assert str(tmp_path / "data" / "nope.jsonl") in line


def test_a_row_without_the_prompt_key(tmp_path, tiny_model_dir):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n")
    line = refused(launch(tmp_path, "task=jsonl", f"task.train_files=[{path}]",
                          f"model.path={tiny_model_dir}"), tmp_path)
    assert str(path) in line and "'prompt'" in line and "question" in line


def test_a_tokenizer_without_an_end_of_sequence_token(tmp_path, tiny_model_dir, rows):
    model = tmp_path / "no-eos"
    shutil.copytree(tiny_model_dir, model)
    for name in ("tokenizer_config.json", "config.json", "generation_config.json"):
        path = model / name
        if path.exists():
            data = json.loads(path.read_text())
            data.pop("eos_token", None)
            data.pop("eos_token_id", None)
            path.write_text(json.dumps(data))
    line = refused(launch(tmp_path, "task=jsonl", f"task.train_files=[{rows}]",
                          f"model.path={model}"), tmp_path)
    assert str(model) in line and "end-of-sequence" in line


def test_a_reward_file_that_does_not_import(tmp_path, tiny_model_dir, rows):
    reward = tmp_path / "my_rewards.py"
    reward.write_text("import numpy\nfrom nowhere import judge\n\ndef score(task, text):\n"
                      "    return 1.0\n")
    line = refused(launch(tmp_path, "task=jsonl", f"task.train_files=[{rows}]",
                          f"model.path={tiny_model_dir}", "reward=python",
                          "reward.path=my_rewards.py"), tmp_path)
    assert str(reward) in line and "nowhere" in line


def test_a_reward_function_that_does_not_exist(tmp_path, tiny_model_dir, rows):
    (tmp_path / "my_rewards.py").write_text("def score(task, text):\n    return 1.0\n")
    line = refused(launch(tmp_path, "task=jsonl", f"task.train_files=[{rows}]",
                          f"model.path={tiny_model_dir}", "reward=python",
                          "reward.path=my_rewards.py", "reward.function=scroe"), tmp_path)
    assert "scroe" in line and "score" in line


def test_a_component_that_dies_before_it_worked_is_not_restarted(tmp_path, tiny_model_dir):
    """A truncated checkpoint passes the tokenizer check but no engine can load it: the
    first component to die stops the run with the end of its log, and nothing is
    restarted to die the same way again."""
    model = tmp_path / "truncated"
    shutil.copytree(tiny_model_dir, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    proc = launch(tmp_path, f"model.path={model}", "+experiment=smoke")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "before it started working, so it is not restarted" in proc.stderr
    assert "  | " in proc.stderr  # the end of the component's log, on the console
    assert "restarting it" not in proc.stderr
    events = tmp_path / "run" / "metrics" / "launcher.jsonl"
    assert not events.exists() or "restart" not in events.read_text()


def test_an_agent_file_that_does_not_exist(tmp_path, tiny_model_dir):
    line = refused(launch(tmp_path, "workflow=agent", "agent.path=agents/nope.py",
                          f"model.path={tiny_model_dir}"), tmp_path)
    assert "agent.path=" in line and str(tmp_path / "agents" / "nope.py") in line


def test_an_agent_function_that_is_not_in_the_file(tmp_path, tiny_model_dir):
    (tmp_path / "agent.py").write_text("async def main(task, client):\n    return 1.0\n")
    line = refused(launch(tmp_path, "workflow=agent", "agent.path=agent.py",
                          "agent.function=run", f"model.path={tiny_model_dir}"), tmp_path)
    assert "agent.function=run is not defined" in line and "it defines: main" in line


def test_a_mistyped_setting_names_the_settings_it_could_be(tmp_path):
    proc = launch(tmp_path, "workflow=agent", "agent.fucntion=run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[0]
    # named as typed: agent.x is short for workflow.x of workflow=agent
    assert "agent.fucntion is not a setting; agent has: " in line and "function" in line
    assert not (tmp_path / "run").exists()


def test_an_agent_setting_on_a_run_without_an_agent_says_so(tmp_path):
    proc = launch(tmp_path, "agent.max_turns=3")
    assert proc.returncode == 2 and not (tmp_path / "run").exists()
    line = proc.stderr.strip().splitlines()[0]
    assert "agent.max_turns is not a setting of this run" in line
    assert "this run's workflow is single_turn" in line


def test_a_mistyped_setting_in_a_section_names_the_nearest(tmp_path):
    proc = launch(tmp_path, "trainer.shared_prefx=false")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    line = proc.stderr.strip().splitlines()[0]
    assert "trainer.shared_prefx is not a setting; trainer has: " in line
    assert line.endswith("(did you mean shared_prefix?)"), line
    assert not (tmp_path / "run").exists()


def test_a_run_wide_setting_put_in_a_section_is_pointed_to_the_top_level(tmp_path):
    proc = launch(tmp_path, "trainer.checkpoint_intervall=5")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[0]
    assert line.endswith("(did you mean checkpoint_interval, a top-level setting?)"), line


@pytest.mark.parametrize(("override", "said"), [
    # a section set whole, with a mistyped key inside it
    ("launcher.trainer={num_gpu: 1}",
     "launcher.trainer.num_gpu is not a setting; launcher.trainer has: num_cpus, num_gpus"),
    # a top-level setting: the nearest names
    ("stepz=3", "stepz is not a setting; did you mean steps?"),
    # a mistyped section above the setting: that section is named
    ("polices.policy.max_staleness=12", "polices is not a setting; did you mean policies?"),
    # an option of a group made of files (experiment): the options there are
    ("+experiment=lorra", "experiment=lorra is not an option; experiment has: lora, smoke "
     "(did you mean lora?)"),
    # a rollout pool's settings, given as a map on the command line
    ("launcher.pools={a: {nodez: 2}}",
     "launcher.pools.a.nodez is not a setting; a pool has: nodes, num_cpus, num_gpus, "
     "resources (did you mean nodes?)"),
    ("launcher.pools={a: {nodes: -2}}", "launcher.pools.a.nodes=-2: must be >= 0"),
    ("launcher.trainer.resources={region_eu: -1}", "launcher.trainer.resources={'region_eu': "
     "-1}: a map of resource name to an amount >= 0, e.g. {region_eu: 1}"),
    # a trainer's ranks take a GPU each
    (("launcher.trainer.num_gpus=1", "trainer.world_size=4"),
     "launcher.trainer.num_gpus=1 but trainer.world_size=4: each rank of the trainer "
     "takes one GPU"),
])
def test_a_mistyped_launcher_setting_is_named(tmp_path, override, said):
    overrides = override if isinstance(override, tuple) else (override,)
    proc = launch(tmp_path, "launcher=ray", *overrides)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert said in proc.stderr.strip().splitlines()[0], proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("overrides", "said"), [
    (["+trainer=megatron", "trainer.world_size=3", "trainer.tensor_model_parallel_size=2"],
     "trainer.world_size=3 is not a multiple of tensor_model_parallel_size x "
     "pipeline_model_parallel_size = 2"),
    (["trainer.world_size=2", "trainer.tensor_model_parallel_size=2"],
     "trainer=hf shards by data parallelism (FSDP2) only"),
    (["trainer.cpu_offload=true"], "trainer.cpu_offload=true offloads FSDP2 shards"),
    (["+trainer=megatron", "trainer.lora.rank=16"],
     "trainer=megatron trains whole models only; train LoRA adapters with trainer=hf"),
    (["trainer.lora.rank=16", "raas=sim"], "raas=sim cannot serve LoRA adapters"),
    (["trainer.lora.rank=16", "trainer.lora.alpha=0"], "trainer.lora.alpha=0.0: must be > 0"),
])
def test_a_trainer_layout_that_cannot_be_is_refused_before_anything_starts(tmp_path,
                                                                           overrides, said):
    line = refused(launch(tmp_path, *overrides), tmp_path)
    assert said in line, line


def test_a_lora_target_that_matches_no_layer_is_refused_before_anything_starts(
        tmp_path, tiny_model_dir):
    line = refused(launch(tmp_path, f"model.path={tiny_model_dir}", "trainer.lora.rank=16",
                          "trainer.lora.target_modules=[q_proj,attn_qkv]"), tmp_path)
    assert line == (f"astraflow: error: trainer.lora.target_modules: ['attn_qkv'] match no "
                    f"module of {tiny_model_dir}; its linear layers are ['down_proj', "
                    "'gate_proj', 'k_proj', 'lm_head', 'o_proj', 'q_proj', 'up_proj', "
                    "'v_proj'] (or use 'all-linear')")


@pytest.mark.parametrize("component", ["train", "raas", "eval"])
def test_a_component_started_alone_with_a_wrong_config_path(tmp_path, component):
    proc = subprocess.run(
        [sys.executable, "-m", "astraflow", component, "--connect", "http://127.0.0.1:1",
         "--config", "run/config.yaml", "--policy", "policy", "--metrics", "m.jsonl"][
            : 8 if component == "raas" else None],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "ASTRAFLOW_TOKEN": "t"})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip() == ("astraflow: error: --config run/config.yaml: no such file "
                                   "(a component takes the config.yaml its run's launcher "
                                   "wrote in the run directory)")


def test_a_mistyped_environment_latency_is_refused_before_anything_starts(tmp_path):
    line = refused(launch(tmp_path, "workflow.latency.kind=lognormla"), tmp_path)
    assert line == ("astraflow: error: workflow.latency.kind=lognormla: choose none, "
                    "fixed or lognormal")


@pytest.mark.parametrize(("override", "said"), [
    ("dataflow.order=edff", "astraflow: error: dataflow.order=edff: choose fifo or edf"),
    ("policies.policy.max_staleness=-1", "astraflow: error: policies.policy.max_staleness=-1: "
     "must be >= 0 (versions a sample may lag the weights it is trained on; null, the "
     "default: derived from the measured turnaround)"),
])
def test_a_bad_data_layer_setting_is_refused_before_anything_starts(tmp_path, override, said):
    assert refused(launch(tmp_path, override), tmp_path) == said


@pytest.mark.parametrize(("override", "said"), [
    ("partial_rollouts=ture", "Value 'ture' is not a valid bool"),
    ("node_concurrency=abc", "Value 'abc' of type 'str' could not be converted to Integer"),
    ("launcher.preload=flase", "Value 'flase' is not a valid bool"),
    # a per-policy setting says what it means, and here how to leave it to the run
    ("policies.policy.max_staleness=auto", "could not be converted to Integer (versions a "
     "sample may lag the weights it is trained on; null, the default: derived"),
])
def test_a_value_of_the_wrong_type_says_why(tmp_path, override, said):
    proc = launch(tmp_path, override)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and override in lines[0] and said in lines[0], proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_data_layer_port_already_in_use(tmp_path, tiny_model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = refused(launch(tmp_path, f"model.path={tiny_model_dir}",
                              f"dataflow.port={port}"), tmp_path)
    assert f"dataflow.port={port}" in line and "cannot listen" in line


def test_a_data_layer_port_out_of_range(tmp_path, tiny_model_dir):
    line = refused(launch(tmp_path, f"model.path={tiny_model_dir}", "dataflow.port=99999"),
                   tmp_path)
    assert line == "astraflow: error: dataflow.port=99999: must be <= 65535"


@pytest.mark.parametrize(("override", "said"), [
    ("steps=-5", "steps=-5: must be >= 1"),
    ("workflow.temperature=-1", "workflow.temperature=-1.0: must be >= 0"),
    ("mode=synk", "mode=synk: choose async or sync"),
    ("checkpoint_interval=-1", "checkpoint_interval=-1.0: must be >= 0"),
    ("+launcher.max_restartz=5", "launcher.max_restartz is not a setting; launcher has: "
     "autoscale_cooldown, autoscale_interval, kind, max_restarts, memory_check, "
     "node_throttle, preload, preload_modules, progress, restart_window (did you mean "
     "max_restarts?)"),
    ("+stepz=5", "stepz is not a setting; did you mean steps?"),
    ("launcher.kind=bogus", "launcher.kind=bogus: choose local or ray"),
    ("launcher.node_throttle=[1.0,1.5]", "launcher.node_throttle=[1.0, 1.5]: must be <= 1"),
    ("batch_size=12", "batch_size=12: a batch is whole groups of group_size=8 samples; make "
     "it a multiple of 8"),
])
def test_a_value_out_of_its_settings_range_is_named(tmp_path, override, said):
    """Bounds and choices are declared with the setting (``config.setting``) and checked
    as the config is composed: nothing starts, no run directory."""
    assert refused(launch(tmp_path, override), tmp_path) == f"astraflow: error: {said}"
