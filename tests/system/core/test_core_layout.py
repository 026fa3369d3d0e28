"""The codebase stays walkable: no source file a newcomer has to scroll through for
minutes, and no two modules that need each other to be understood (an import circle)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
MAX_LINES = 600


def packages() -> dict[str, Path]:
    """Each importable package of the tree (the core's and every plugin's) and its root."""
    found = {"astraflow": ROOT / "core"}
    for pkg in sorted((ROOT / "plugins").glob("*/astraflow_*/__init__.py")):
        found[pkg.parent.name] = pkg.parent.parent
    return found


def modules() -> dict[str, Path]:
    out = {}
    for name, root in packages().items():
        for path in (root / name).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the tree it imports, at any depth of its code (an import
    inside a function is a dependency too, only a later one)."""

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            graph[mod] |= {o for n in names if (o := owner(n)) and o != mod}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_in_the_core_or_any_plugin():
    graph = import_graph(modules())
    assert "astraflow.dataflow.service" in graph["astraflow.dataflow.server"]
    assert circles(graph) == []


def test_the_checker_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]


def test_no_source_file_is_over_600_lines():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    assert len(files) > 100
    long = {f: n for f in files
            if (n := len((ROOT / f).read_text().splitlines())) > MAX_LINES}
    assert long == {}
