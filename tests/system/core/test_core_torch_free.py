"""The core installs and imports without torch, Ray or any engine."""

import subprocess
import sys
from importlib import metadata

HEAVY = ("torch", "vllm", "sglang", "megatron", "transformers", "ray")


def test_import_astraflow_imports_no_heavy_library():
    code = (
        "import sys, astraflow, astraflow.config, astraflow.plugins, astraflow.cli;"
        "import astraflow.launch.local, astraflow.launch.ray;"
        "from astraflow.plugins import get_registry; get_registry();"
        f"bad = [m for m in {HEAVY!r} if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_planning_what_to_preload_imports_none_of_it(tiny_model_dir):
    """The launcher names what the preloaded parent imports without importing any of it
    itself: a second of transformers on the launcher's start-up path."""
    code = (
        "import sys; from astraflow.config import compose_config;"
        "from astraflow.launch import preload;"
        "cfg = compose_config(['+raas=vllm']);"
        f"names = preload.modules_for(cfg) + preload.model_modules({tiny_model_dir!r});"
        "assert 'torch' in names and any(n.endswith('modeling_llama') for n in names), names;"
        f"bad = [m for m in {HEAVY!r} if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_core_distribution_does_not_depend_on_torch():
    requirements = metadata.requires("astraflow") or []
    core = [r for r in requirements if "extra ==" not in r]
    assert not [r for r in core if r.split()[0].lower().startswith(HEAVY)], core


def preflight(*overrides: str) -> subprocess.CompletedProcess:
    """The launcher's check of the selected engines' settings, in a fresh interpreter:
    what it imported, or the one line it refused with."""
    code = (
        "import sys; from astraflow.config import compose_config;"
        "from astraflow.errors import ConfigError;"
        "from astraflow.launch.preflight import check_backends\n"
        "try:\n"
        f"    check_backends(compose_config({list(overrides)!r}))\n"
        "except ConfigError as exc:\n    sys.exit(str(exc))\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_the_launchers_engine_check_imports_no_engine():
    """Start-up: the launcher judges raas/trainer settings before anything starts, but an
    engine import there (torch, transformers, vLLM: 9-19 s here) would delay every run."""
    for overrides in ([], ["raas=vllm", "trainer=megatron"], ["raas=sim"]):
        proc = preflight(*overrides)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == "[]", (overrides, proc.stdout)


def test_a_bad_engine_setting_is_still_refused_before_anything_starts():
    for override, said in (("raas.dtype=float8",
                            "raas.dtype=float8: choose auto, float32 or bfloat16"),
                           ("trainer.loss=reinforce", "trainer.loss=reinforce: choose ppo or m2po"),
                           ("trainer.mixed_precision=fp8",
                            "trainer.mixed_precision=fp8: choose none or bfloat16")):
        proc = preflight(override)
        assert proc.returncode == 1, (override, proc.stdout, proc.stderr)
        assert proc.stderr.strip() == said, proc.stderr
