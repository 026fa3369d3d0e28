"""The elasticity tests drive real runs with the fault tests' helpers and, for the
cross-region test, a shaped link of their own (shaped_link.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "faults"))
