"""The run's memory estimate (astraflow.launch.memory) from safetensors headers and the
run's settings, the machine's memory from /proc and cgroups, pre-flight's refusal of a
run that cannot fit, and the launcher's verdict on a component killed by SIGKILL
(astraflow.launch.oom), with files the tests write standing for /proc and /sys."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import DictConfig, OmegaConf
from sized_checkpoints import QWEN_1_5B, header_only_checkpoint

from astraflow.components import resolve_policies
from astraflow.config import compose_config
from astraflow.errors import ConfigError
from astraflow.launch import memory, oom
from astraflow.launch.memory import GIB, Checkpoint
from astraflow.launch.preflight import check_memory
from astraflow.weights import safetensors_io

#: Qwen2.5-1.5B's published shape
HIDDEN, INTER, LAYERS, VOCAB = (QWEN_1_5B[k] for k in ("hidden_size", "intermediate_size",
                                                       "num_hidden_layers", "vocab_size"))


def run_config(*overrides: str) -> DictConfig:
    """The config the launcher checks: composed, resolved, its policies filled in."""
    cfg = compose_config(list(overrides))
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    assert isinstance(cfg, DictConfig)
    cfg.policies = resolve_policies(cfg)
    return cfg


@pytest.fixture
def huge(tmp_path: Path) -> str:
    return str(header_only_checkpoint(tmp_path / "huge"))


def small_checkpoint(out: Path) -> Path:
    out.mkdir()
    rng = np.random.default_rng(0)
    tensors = {
        "model.embed_tokens.weight": safetensors_io.bf16_from_float32(rng.random((50, 16))),
        "model.layers.0.self_attn.q_proj.weight":
            safetensors_io.bf16_from_float32(rng.random((16, 16))),
        "model.layers.0.mlp.up_proj.weight": safetensors_io.bf16_from_float32(rng.random((32, 16))),
        "model.norm.weight": safetensors_io.Tensor.from_array(rng.random(16).astype(np.float32)),
        "lm_head.weight": safetensors_io.bf16_from_float32(rng.random((50, 16))),
    }
    safetensors_io.save(out / "model.safetensors", tensors)
    (out / "config.json").write_text(json.dumps({
        "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 50,
        "max_position_embeddings": 64}))
    return out


def test_a_checkpoint_is_read_from_its_headers(tmp_path: Path) -> None:
    ckpt = memory.read_checkpoint(small_checkpoint(tmp_path / "small"))
    assert ckpt is not None
    assert ckpt.parameters == 50 * 16 + 16 * 16 + 32 * 16 + 16 + 50 * 16
    assert ckpt.dtype == "BF16"  # most parameters; the norm's float32 is a minority
    assert (ckpt.hidden, ckpt.layers, ckpt.vocab, ckpt.kv_width) == (16, 1, 50, 8)
    assert set(ckpt.linear) == {"model.layers.0.self_attn.q_proj",
                                "model.layers.0.mlp.up_proj", "lm_head"}
    # all-linear adapts every linear layer but the output head, rank x (in + out) each
    assert memory.adapter_parameters(ckpt, 4, "all-linear") == 4 * (32 + 48)
    assert memory.adapter_parameters(ckpt, 4, ["q_proj"]) == 4 * 32


def test_a_checkpoint_without_safetensors_or_with_a_broken_one_is_none(tmp_path: Path) -> None:
    assert memory.read_checkpoint(tmp_path) is None
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40))
    assert memory.read_checkpoint(tmp_path) is None


def test_a_huge_checkpoint_costs_a_header_read(huge: str) -> None:
    started = time.perf_counter()
    ckpt = memory.read_checkpoint(huge)
    assert time.perf_counter() - started < 0.5
    assert ckpt is not None and 1.5e9 < ckpt.parameters < 1.6e9
    assert Path(huge, "model.safetensors").stat().st_blocks * 512 < 1 << 20  # sparse


def test_the_trainer_budget_is_16_bytes_a_parameter_for_float32_adamw(huge: str) -> None:
    cfg = run_config(f"model.path={huge}")
    est = memory.estimate(cfg, prompt_tokens=20, gpu=False, machine=64 * GIB)
    trainer = next(p for p in est.parts if p.name == "trainer-policy")
    terms = {t.what: t.bytes for t in trainer.terms}
    params = memory.read_checkpoint(huge).parameters  # type: ignore[union-attr]
    assert terms["weights, grads and AdamW"] == 16 * params
    assert terms["published copy"] == 2 * params
    assert est.biggest() is trainer
    # bfloat16 master weights halve the states; LoRA trains adapters alone
    half = memory.estimate(run_config(f"model.path={huge}", "trainer.dtype=bfloat16"),
                           prompt_tokens=20, gpu=False, machine=64 * GIB)
    assert {t.what: t.bytes for t in half.parts[0].terms}["weights, grads and AdamW"] == 8 * params
    lora = memory.estimate(run_config(f"model.path={huge}", "trainer.lora.rank=16"),
                           prompt_tokens=20, gpu=False, machine=64 * GIB)
    assert lora.parts[0].each < 0.5 * trainer.each
    kl = memory.estimate(run_config(f"model.path={huge}", "trainer.kl_coef=0.01"),
                         prompt_tokens=20, gpu=False, machine=64 * GIB)
    assert kl.parts[0].each == trainer.each + 4 * params


def test_activations_follow_the_micro_batch(huge: str) -> None:
    ckpt = memory.read_checkpoint(huge)
    assert ckpt is not None
    seq = 500 + 6  # the sampled prompt and single_turn's max_new_tokens

    def activations(*overrides: str) -> int:
        cfg = run_config(f"model.path={huge}", *overrides)
        assert memory.sequence_tokens(cfg, ckpt, 500) == seq
        return memory.trainer_activations(cfg, cfg.trainer, ckpt, seq)[0]

    big = activations()
    est = memory.estimate(run_config(f"model.path={huge}"), prompt_tokens=500, gpu=False,
                          machine=64 * GIB)
    assert {t.what: t.bytes for t in est.parts[0].terms}["activations"] == big
    per_token = VOCAB * 4 * 3 + LAYERS * (10 * HIDDEN + 4 * INTER) * 4
    assert big == 64 * seq * per_token
    assert activations("trainer.micro_batch_size=8") == 8 * seq * per_token
    assert activations("trainer.micro_batch_tokens=2048") == 2048 * per_token
    # checkpointing keeps each layer's input and one layer's set; the logits stay
    assert activations("trainer.activation_checkpointing=true") == 64 * seq * (
        VOCAB * 4 * 3 + (LAYERS * HIDDEN + 10 * HIDDEN + 4 * INTER) * 4)
    # a micro-batch holds at most the batch
    assert activations("batch_size=16") == 16 * seq * per_token


def test_a_checkpoint_written_between_steps_counts_when_it_is_larger(huge: str) -> None:
    """A sharded trainer's checkpoint is serialised in memory before it is written; a
    single-process trainer=hf writes it from its tensors (no copy to count)."""
    params = memory.read_checkpoint(huge).parameters  # type: ignore[union-attr]

    def terms(*overrides: str) -> dict[str, int]:
        est = memory.estimate(run_config(f"model.path={huge}", *overrides), prompt_tokens=4,
                              gpu=False, machine=64 * GIB)
        return {t.what: t.bytes for t in est.parts[0].terms}

    sharded = terms("trainer.world_size=2")
    assert sharded["checkpoint being written"] == memory.CHECKPOINT_COPIES * 12 * params
    assert "activations" not in sharded
    single = terms()
    assert "checkpoint being written" not in single and single["activations"] > 0


def test_components_are_counted_as_the_launcher_starts_them(huge: str) -> None:
    def parts(*overrides: str) -> dict[str, Any]:
        est = memory.estimate(run_config(f"model.path={huge}", *overrides), prompt_tokens=20,
                              gpu=False, machine=64 * GIB)
        return {p.name: p for p in est.parts}

    one = parts()
    assert one["rollout node"].count == 1
    node = one["rollout node"].each
    assert parts("num_nodes=3")["rollout nodes"].count == 3
    assert parts("autoscale=true", "max_nodes=5")["rollout nodes"].count == 5
    assert parts("launcher=ray", "launcher.pools={a: {nodes: 2}, b: {nodes: 3}}")[
        "rollout nodes"].count == 5
    assert "rollout node" not in parts("num_nodes=0")
    # two policies: two trainers, two evaluators, two engines in each node and evaluator
    two = parts("workflow=solve_verify")
    assert {"trainer-solver", "trainer-verifier", "eval-solver", "eval-verifier"} <= set(two)
    assert two["rollout node"].each > 1.8 * node
    # an engine in bfloat16 holds its weights in half; a deferred evaluator none
    assert parts("raas.dtype=bfloat16")["rollout node"].each < node
    assert parts("eval_deferred=true")["eval-policy"].each == memory.TORCH_PROCESS
    # vLLM: its KV cache as set, and its engine-core process
    vllm = {t.what: t.bytes for t in parts("raas=vllm", "raas.kv_cache_gib=3")[
        "rollout node"].terms}
    assert vllm["KV cache"] == 3 * GIB and vllm["engine core"] == memory.TORCH_PROCESS
    # the simulator holds no model
    assert parts("raas=sim")["rollout node"].each == memory.TORCH_PROCESS


def test_an_engine_counts_auto_as_the_dtype_its_checkpoint_declares(huge: str) -> None:
    """``raas.dtype=auto`` (the default) is what the engines load: the dtype config.json
    declares, float32 when it declares none (this checkpoint's tensors are bf16)."""
    def node(*overrides: str) -> tuple[dict[str, int], str]:
        est = memory.estimate(run_config(f"model.path={huge}", *overrides), prompt_tokens=20,
                              gpu=False, machine=64 * GIB)
        part = next(p for p in est.parts if p.name == "rollout node")
        return {t.what: t.bytes for t in part.terms}, part.advice

    params = memory.read_checkpoint(huge).parameters  # type: ignore[union-attr]
    terms, advice = node()
    assert terms["weights"] == 4 * params and "raas.dtype=bfloat16" in advice
    config = Path(huge, "config.json")
    config.write_text(json.dumps({**json.loads(config.read_text()), "torch_dtype": "bfloat16"}))
    terms, advice = node()
    assert terms["weights"] == 2 * params and "raas.dtype" not in advice
    assert node("raas=vllm")[0]["weights"] == 2 * params
    assert node("raas.dtype=float32")[0]["weights"] == 4 * params


def test_components_on_a_gpu_cost_the_host_little(huge: str) -> None:
    cfg = run_config(f"model.path={huge}")
    on_cpu = memory.estimate(cfg, prompt_tokens=20, gpu=False, machine=64 * GIB)
    on_gpu = memory.estimate(cfg, prompt_tokens=20, gpu=True, machine=64 * GIB)
    assert on_gpu.parts[0].each < 0.2 * on_cpu.parts[0].each


def test_the_default_tiny_run_is_estimated_small_and_fast() -> None:
    cfg = run_config()
    started = time.perf_counter()
    est = check_memory(cfg, machine=(8 * GIB, "this machine"))
    assert time.perf_counter() - started < 0.1
    assert est is not None and est.bytes < 3 * GIB


def test_a_run_that_cannot_fit_is_refused_in_one_line(huge: str) -> None:
    cfg = run_config(f"model.path={huge}")
    with pytest.raises(ConfigError) as refused:
        check_memory(cfg, prompt_tokens=20, machine=(int(23.4 * GIB), "this machine"))
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith("this run needs about ")
    assert "(trainer-policy " in line and "parameters x 16 B for float32 AdamW" in line
    assert "but this machine has 23.4 GiB" in line
    assert "trainer.lora.rank=16" in line
    assert line.endswith("or set launcher.memory_check=false to start it anyway")
    # a cgroup's limit is named as such; the check can be switched off
    with pytest.raises(ConfigError, match=r"but its cgroup \(memory.max of /x\) allows 8.0 GiB"):
        check_memory(cfg, prompt_tokens=20, machine=(8 * GIB, "its cgroup (memory.max of /x)"))
    assert check_memory(run_config(f"model.path={huge}", "launcher.memory_check=false"),
                        machine=(GIB, "this machine")) is None


def test_the_machine_memory_is_the_lower_of_memtotal_and_a_cgroup_limit(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683792 kB\nMemFree:  1 kB\n")
    root = tmp_path / "cg"
    inner = root / "a" / "b"
    inner.mkdir(parents=True)
    (inner / "memory.max").write_text("max\n")
    cgroup = memory.MemoryCgroup(inner, root, 2)
    assert memory.machine_memory(cgroup, meminfo) == (24683792 * 1024, "this machine")
    (root / "a" / "memory.max").write_text(f"{4 * GIB}\n")  # an ancestor's limit binds
    limit, where = memory.machine_memory(cgroup, meminfo)
    assert limit == 4 * GIB and "memory.max" in where
    v1 = memory.MemoryCgroup(inner, root, 1)
    (inner / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # unlimited
    assert memory.machine_memory(v1, meminfo)[0] == 24683792 * 1024


def test_the_memory_cgroup_is_found_from_proc(tmp_path: Path) -> None:
    proc, sys_cg = tmp_path / "proc", tmp_path / "sys"
    proc.mkdir()
    (sys_cg / "memory" / "jobs" / "j1").mkdir(parents=True)
    (sys_cg / "memory" / "jobs" / "j1" / "memory.oom_control").write_text("oom_kill 0\n")
    (sys_cg / "unified").mkdir()
    (proc / "cgroup").write_text("4:memory:/jobs/j1\n1:cpu:/\n0::/\n")
    (proc / "mounts").write_text(f"cgroup2 {sys_cg / 'unified'} cgroup2 rw 0 0\n"
                                 f"cgroup {sys_cg / 'memory'} cgroup rw,relatime,memory 0 0\n")
    found = memory.memory_cgroup(proc)
    # the unified hierarchy has no memory controller here: cgroup v1's memory
    assert found == memory.MemoryCgroup(sys_cg / "memory" / "jobs" / "j1", sys_cg / "memory", 1)
    assert found.events.name == "memory.oom_control"


# -- the launcher's verdict on a SIGKILL -------------------------------------------------

def watch(tmp_path: Path, count: int | None, limit: int = 8 * GIB) -> tuple[oom.MemoryWatch, Path]:
    events = tmp_path / "memory.events"
    if count is not None:
        events.write_text(f"low 0\nhigh 0\nmax 3\noom 1\noom_kill {count}\n")
    found = oom.OomCount(events, "cgroup") if count is not None else None
    return oom.MemoryWatch(count=found, limit=(limit, "this machine")), events


def test_a_sigkill_while_the_oom_kill_count_rose_is_the_oom_killer(tmp_path: Path) -> None:
    memory_watch, events = watch(tmp_path, 0)
    memory_watch.tick()
    events.write_text("oom 1\noom_kill 1\n")
    death = memory_watch.death("trainer-policy", -9, int(7.5 * GIB))
    assert death is not None and death.verdict == "oom"
    assert "oom_kill 0 -> 1" in death.evidence
    line = death.said("trainer-policy", Path("/run/logs/trainer-policy.log"))
    assert "\n" not in line
    assert line.startswith("trainer-policy was killed by the kernel's OOM killer at a peak "
                           "of 7.5 GiB (this machine has 8.0 GiB); it is not restarted")
    assert "trainer.micro_batch_size" in line and "/run/logs/trainer-policy.log" in line
    # one kill explains one death: a second SIGKILL in the same window is a plain one
    assert memory_watch.death("raas-0", -9, GIB) is None


def test_a_sigkill_with_the_count_unchanged_or_another_exit_is_no_oom(tmp_path: Path) -> None:
    memory_watch, events = watch(tmp_path, 5)
    memory_watch.tick()
    assert memory_watch.death("raas-0", -9, 7 * GIB) is None
    events.write_text("oom_kill 6\n")
    assert memory_watch.death("raas-0", 1, 7 * GIB) is None  # it exited, not killed


def test_without_a_count_a_sigkill_of_a_component_that_held_half_is_likely_oom(
        tmp_path: Path) -> None:
    memory_watch, _ = watch(tmp_path, None)
    assert memory_watch.death("raas-0", -9, GIB) is None
    death = memory_watch.death("trainer-policy", -9, 5 * GIB)
    assert death is not None and death.verdict == "likely"
    assert death.said("trainer-policy", Path("t.log")).startswith(
        "trainer-policy was killed by SIGKILL (likely the kernel's OOM killer: peak 5.0 GiB; "
        "this machine has 8.0 GiB)")


def test_the_count_is_read_from_a_cgroup_or_the_machine(tmp_path: Path) -> None:
    (tmp_path / "oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 7\n")
    assert oom.OomCount(tmp_path / "oom_control", "cgroup").read() == 7
    assert oom.OomCount(tmp_path / "missing", "cgroup").read() is None
    found = oom.OomCount.find()  # this machine's: some count is always readable on Linux
    assert found is not None and found.read() is not None


def test_peaks_are_kept_per_life_and_overall() -> None:
    memory_watch = oom.MemoryWatch(count=None, limit=(8 * GIB, "this machine"))
    memory_watch.started("raas-0")
    memory_watch.exited("raas-0", 3 * GIB)
    memory_watch.started("raas-0")  # restarted
    memory_watch.exited("raas-0", GIB)
    assert memory_watch.peaks["raas-0"] == GIB
    assert memory_watch.highest["raas-0"] == 3 * GIB


def test_the_tiny_checkpoint_estimate_needs_no_file() -> None:
    cfg = run_config()
    ckpt = memory.tiny_checkpoint(cfg.model)
    assert isinstance(ckpt, Checkpoint) and 0 < ckpt.parameters < 2_000_000
