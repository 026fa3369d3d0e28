"""AstraFlow: dataflow-oriented reinforcement learning for agentic LLMs.

The core is torch-free. Rollout engines, trainers and data algorithms are plugins
registered through the hook specs in :mod:`astraflow.hookspecs`.
"""

from astraflow.hookspecs import hookimpl

__version__ = "1.2.0"
__all__ = ["__version__", "hookimpl"]
