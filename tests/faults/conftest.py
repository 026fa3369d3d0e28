"""The fault tests drive real `python -m astraflow` runs (helpers in launched_runs.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
