"""The registered implementation of ``raas=sglang``.

The launcher calls ``check_config`` before starting any process, so a machine that
would have to start SGLang without having it fails there, at once, with what to
install where -- not minutes later inside a node. Attaching to a server someone else
runs (``raas.url``) needs only HTTP, so it works from any machine.
"""

from astraflow_raas_sglang.engine import SGLangRolloutBackend

__all__ = ["SGLangRolloutBackend"]
