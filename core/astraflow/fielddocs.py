"""The comments that document a config dataclass's fields, read from its source: what
``--help`` shows of a setting, and a standalone command's flags say of theirs."""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize


def field_docs(cls: type) -> dict[str, str]:
    """The comments that document a dataclass's fields: the ``#:`` / ``#`` lines just
    above a field and the comment after it on its line, by field name; a field a base
    class declares has the base's comment, unless the class comments it again."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__[:-1]):
        docs.update(_own_docs(klass))
    return docs


def _own_docs(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    lines = source.splitlines()
    comments: dict[int, str] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#:").strip()
    except (tokenize.TokenError, IndentationError):
        return {}
    body = ast.parse(source).body[0]
    docs = {}
    for node in getattr(body, "body", []):
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        above: list[str] = []
        row = node.lineno - 1
        while row >= 1 and lines[row - 1].strip().startswith("#"):
            above.insert(0, comments.get(row, ""))
            row -= 1
        inline = comments.get(node.end_lineno or node.lineno, "")
        text = " ".join(part for part in (*above, inline) if part)
        if text:
            docs[node.target.id] = text
    return docs
