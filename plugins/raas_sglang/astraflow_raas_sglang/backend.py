"""The registered implementation of ``raas=sglang``.

The launcher loads it before starting any process, so a machine without SGLang fails
here, at once, with what to install where -- not minutes later inside a node.
"""

import importlib.util

from astraflow_raas_sglang.engine import SGLangRolloutBackend
from astraflow_raas_sglang.errors import INSTALL_HINT, SGLangUnavailableError

if importlib.util.find_spec("sglang") is None:
    raise SGLangUnavailableError(INSTALL_HINT)

__all__ = ["SGLangRolloutBackend"]
