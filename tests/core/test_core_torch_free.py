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


def test_core_distribution_does_not_depend_on_torch():
    requirements = metadata.requires("astraflow") or []
    core = [r for r in requirements if "extra ==" not in r]
    assert not [r for r in core if r.split()[0].lower().startswith(HEAVY)], core
