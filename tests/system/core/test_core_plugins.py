"""Plugin discovery, listing, duplicate rejection and failure isolation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from astraflow import hookimpl
from astraflow.errors import DuplicateNameError, UnknownOptionError
from astraflow.plugins import AstraFlowPluginManager, PluginInfo

ALL_PLUGINS = {
    "raas_hf": ("astraflow-plugin-raas-hf", {"raas": ["hf"]}),
    "raas_vllm": ("astraflow-plugin-raas-vllm", {"raas": ["vllm"]}),
    "raas_sglang": ("astraflow-plugin-raas-sglang", {"raas": ["sglang"]}),
    "trainer_hf": ("astraflow-plugin-trainer-hf", {"trainer": ["hf"]}),
    "trainer_megatron": ("astraflow-plugin-trainer-megatron", {"trainer": ["megatron"]}),
    "data_greso": ("astraflow-plugin-data-greso", {"data": ["greso"]}),
    "data_replay": ("astraflow-plugin-data-replay", {"data": ["replay"]}),
}


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "astraflow", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def test_plugins_json_lists_all_seven_with_what_they_provide():
    proc = run_cli("plugins", "--json")
    assert proc.returncode == 0, proc.stderr
    listed = {p["name"]: p for p in json.loads(proc.stdout)}
    for name, (dist, provides) in ALL_PLUGINS.items():
        assert listed[name]["distribution"] == dist
        assert listed[name]["version"] == "0.1.0"
        for group, options in provides.items():
            assert set(options) <= set(listed[name]["provides"][group])
        assert listed[name]["hooks"], f"{name} lists no hooks"
    assert "dynamic_sampling" in listed["builtins"]["provides"]["data"]


def test_plugins_table_is_readable():
    proc = run_cli("plugins")
    assert proc.returncode == 0
    assert "astraflow-plugin-raas-vllm" in proc.stdout


def test_allow_list_and_autoload_off(monkeypatch):
    import os

    env = dict(os.environ, ASTRAFLOW_PLUGINS="raas_hf")
    names = {p["name"] for p in json.loads(run_cli("plugins", "--json", env=env).stdout)}
    assert names == {"builtins", "raas_hf"}
    env = dict(os.environ, ASTRAFLOW_DISABLE_PLUGIN_AUTOLOAD="1")
    names = {p["name"] for p in json.loads(run_cli("plugins", "--json", env=env).stdout)}
    assert names == {"builtins"}


def test_trace_variable_traces_hook_calls():
    import os

    env = dict(os.environ, ASTRAFLOW_TRACE_PLUGINS="1")
    proc = run_cli("plugins", "--json", env=env)
    assert proc.returncode == 0
    assert "astraflow_register_rollout_backends" in proc.stderr


class _Provider:
    def __init__(self, backend_name: str) -> None:
        self.backend_name = backend_name

    @hookimpl
    def astraflow_register_rollout_backends(self, register):
        register(self.backend_name, "json:dumps")


def _manager(*plugins) -> AstraFlowPluginManager:
    pm = AstraFlowPluginManager()
    for i, plugin in enumerate(plugins):
        name = f"p{i}"
        pm.infos[name] = PluginInfo(name, f"dist-{name}", "1.0")
        pm.register(plugin, name=name)
    return pm


def test_duplicate_names_are_rejected_naming_both_providers():
    pm = _manager(_Provider("same"), _Provider("same"))
    with pytest.raises(DuplicateNameError) as err:
        pm.build_registry()
    assert "dist-p0" in str(err.value) and "dist-p1" in str(err.value)


def test_unknown_option_lists_installed_and_pip_hint():
    registry = _manager(_Provider("mine")).build_registry()
    with pytest.raises(UnknownOptionError) as err:
        registry.get("rollout_backend", "fancy")
    message = str(err.value)
    assert "mine" in message and "pip install astraflow-plugin-raas-fancy" in message


def test_a_hook_that_raises_is_reported_and_the_rest_still_registers(capsys):
    class Broken:
        @hookimpl
        def astraflow_register_rollout_backends(self, register):
            raise RuntimeError("boom")

    pm = _manager(Broken(), _Provider("fine"))
    registry = pm.build_registry()
    assert registry.names("rollout_backend") == ["fine"]
    assert "boom" in registry.plugins["p0"].error
    assert "dist-p0" in capsys.readouterr().err


def test_check_pending_unloads_a_plugin_with_a_misspelt_hook(monkeypatch, capsys):
    import astraflow.plugins as plugins_mod

    class Typo:
        @hookimpl
        def astraflow_register_rollout_backend(self, register):  # missing "s"
            raise AssertionError("never called")

    original = AstraFlowPluginManager.load_entrypoints

    def load(self):
        original(self)
        self.infos["typo"] = PluginInfo("typo", "dist-typo", "0.0")
        self.register(Typo(), name="typo")

    monkeypatch.setattr(AstraFlowPluginManager, "load_entrypoints", load)
    pm = plugins_mod.get_plugin_manager()
    assert pm.get_plugin("typo") is None
    assert "typo" in capsys.readouterr().err
    assert pm.infos["typo"].error


def test_a_backend_that_cannot_run_here_refuses_before_anything_starts(tmp_path):
    proc = run_cli("+raas=sglang", f"run_dir={tmp_path / 'run'}")
    assert proc.returncode == 2
    assert "GPU" in proc.stderr and "pip install" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
