"""The model fixtures' module imports no torch: checked in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_module_imports_no_torch():
    code = ("import sys, astraflow.testing.models, astraflow.testing.pytest_plugin;"
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
