"""Tools a workflow can call. Output is context for the model, never trained on."""

from __future__ import annotations

import ast
import operator
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from astraflow.sandbox import Sandbox, SandboxConfig

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculator(expression: str) -> str:
    """Evaluate integer ``+ - *`` arithmetic safely (no ``eval``); errors become text."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        return str(_eval(tree.body))
    except (SyntaxError, ValueError, RecursionError):
        return "error"


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if max(abs(left), abs(right)) > 10**6:
            raise ValueError("operand too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    raise ValueError(f"unsupported expression: {ast.dump(node)}")


def sandbox_from(config: SandboxConfig | object) -> Sandbox:
    """A :class:`~astraflow.sandbox.Sandbox` from a workflow's ``sandbox`` settings (the
    dataclass, or the OmegaConf node a node's config holds)."""
    from omegaconf import OmegaConf

    from astraflow.sandbox import Sandbox, SandboxConfig

    if not isinstance(config, SandboxConfig):
        config = SandboxConfig(**cast(dict[str, Any], OmegaConf.to_container(config)))
    return Sandbox(config)


#: longest tool answer put back into the context, in characters
MAX_TOOL_OUTPUT = 200


async def python(sandbox: Sandbox, expression: str) -> str:
    """The value of a Python ``expression``, computed in ``sandbox``: what it prints
    (``print(expression)``), or ``error``/``timeout`` -- untrusted code never runs in
    the node's own interpreter."""
    result = await sandbox.run(f"print({expression})")
    if result.status == "timeout":
        return "timeout"
    if not result.ok:
        return "error"
    return result.stdout.strip()[:MAX_TOOL_OUTPUT]
