"""The dashboard tests drive real runs with the fault tests' helpers."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "faults"))
