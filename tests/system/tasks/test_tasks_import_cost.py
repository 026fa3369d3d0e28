"""Loading a dataset module costs nothing it does not need: checked in a fresh interpreter."""

from __future__ import annotations

import sys


def test_importing_the_module_loads_no_optional_or_heavy_library():
    import subprocess

    code = ("import sys, astraflow.tasks.files, astraflow.tasks.columnar; "
            "bad = [m for m in ('torch', 'transformers', 'pyarrow', 'datasets') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
