"""The CLI explains itself: ``--help`` names every config group with its installed
options and where each came from, ``--help GROUP=OPTION`` shows that option's settings
with defaults and docs, and Hydra's ``--cfg job`` prints the composed config."""

from __future__ import annotations

import subprocess
import sys

import yaml


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astraflow", *args], capture_output=True,
                          text=True, timeout=120)


def test_help_lists_commands_groups_options_their_sources_and_settings():
    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for command in ("plugins", "dataflow", "raas", "train", "eval", "new-plugin"):
        assert f"\n  {command} " in out, command
    lines = out.splitlines()
    groups = {}
    for line in lines[lines.index("Config groups (GROUP=OPTION; --help GROUP=OPTION shows "
                                  "its settings):") + 1:]:
        if not line:
            break
        if not line.startswith("    "):
            group = line.strip().rstrip(":")
            groups[group] = {}
        else:
            name, source = line.split("[", 1)
            groups[group][name.split()[0]] = source.split("]")[0]
    assert set(groups) >= {"raas", "trainer", "data", "workflow", "task", "reward",
                           "launcher", "experiment", "logger"}
    # plugin options name their distribution; file-based ones their file
    assert groups["raas"]["vllm"].startswith("astraflow-plugin-raas-vllm ")
    assert groups["trainer"]["megatron"].startswith("astraflow-plugin-trainer-megatron ")
    assert groups["workflow"]["solve_verify"].startswith("astraflow ")
    assert groups["experiment"]["lora"] == "conf/experiment/lora.yaml"
    assert "hf (default)" in out
    # the run's own settings, with defaults and what they mean
    assert "  steps: int = 600" in out
    assert "node_concurrency: int = 64  -- most tasks a RaaS node keeps in flight" in out


def test_help_on_an_option_shows_its_settings_defaults_and_docs():
    proc = cli("--help", "raas=vllm")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("raas=vllm  [astraflow-plugin-raas-vllm ")
    assert "  raas.kv_cache_gib: float | None = 1.0  -- KV cache size" in proc.stdout
    assert "  raas.enforce_eager: bool = True  -- Eager mode" in proc.stdout
    # a data algorithm's settings sit under data.<name>.
    assert "  data.greso." in cli("--help", "data=greso").stdout
    # a file-based option shows its file; a section its keys; a group its options
    assert "rank: 16" in cli("--help", "experiment=lora").stdout
    assert "  model.warmstart_steps: int = 400" in cli("--help", "model").stdout
    assert "    sim  [astraflow-plugin-raas-sim " in cli("-h", "raas").stdout
    # `python -m astraflow raas=vllm --help` (Hydra's order) works too
    assert "raas.kv_cache_gib" in cli("raas=vllm", "--help", "raas=vllm").stdout


def test_help_on_an_unknown_option_is_one_line_naming_the_options():
    proc = cli("--help", "raas=vlm")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("astraflow: error: --help raas=vlm: raas has no option "
                                   "'vlm' (did you mean raas=vllm?); it has: hf, sglang, "
                                   "sim, vllm")


def test_a_mistyped_command_is_one_line_naming_the_commands():
    proc = cli("tinkr", "--model", "x")
    assert proc.returncode == 2 and proc.stdout == ""
    line = proc.stderr.strip()
    assert "\n" not in line
    assert line.startswith("astraflow: unknown command 'tinkr': did you mean 'tinker'?")
    assert "dataflow" in line and "_preload" not in line
    # a run's overrides are not commands
    assert "unknown command" not in cli("--help", "raas=sim").stderr


def test_cfg_job_prints_the_composed_config_as_hydra_does():
    for flags in (["--cfg", "job"], ["-c", "job"], ["--cfg=job"], ["--cfg"]):
        proc = cli(*flags, "steps=7", "raas=sim")
        assert proc.returncode == 0, (flags, proc.stderr)
        cfg = yaml.safe_load(proc.stdout)
        assert cfg["steps"] == 7 and cfg["raas"]["name"] == "sim", flags
    proc = cli("--cfg", "job", "--package", "trainer", "trainer.lr=1e-4")
    assert yaml.safe_load(proc.stdout)["lr"] == 1e-4
    assert cli("--cfg", "all", "-p", "model.hidden_size").stdout.strip() == "128"
    proc = cli("--cfg", "hydra")
    assert proc.returncode == 2 and "--cfg job" in proc.stderr
