"""The codebase stays walkable: no source file a newcomer has to scroll through for
minutes, and no two modules that need each other to be understood (an import circle)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

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


# ---- the data layer, the trainer, the launchers: collaborators that own their state ------

DATAFLOW = ROOT / "core" / "astraflow" / "dataflow"
TRAINER = ROOT / "core" / "astraflow" / "trainer"
LAUNCH = ROOT / "core" / "astraflow" / "launch"
MAX_FUNCTION_LINES = 60


def private_reaches(source: str, filename: str) -> list[str]:
    """Where a module reaches a private name (``_x``) that is not its own object's:
    ``other._x``, ``self.ledger._x``, ``module._x``, ``from module import _x``. Only
    ``self._x`` and ``cls._x`` are a collaborator's own."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                found.append(f"{filename}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{filename}:{node.lineno}: from {node.module} import {alias.name}"
                      for alias in node.names if _private(alias.name)]
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def long_functions(source: str, filename: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    return [f"{filename}:{node.lineno}: {node.name} has {n} lines"
            for node in ast.walk(ast.parse(source, filename))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and (n := node.end_lineno - node.lineno + 1) > limit]  # type: ignore[operator]


@pytest.mark.parametrize("room", [DATAFLOW, TRAINER], ids=lambda p: p.name)
def test_no_collaborator_reaches_another_ones_private_names(room):
    files = sorted(room.glob("*.py"))
    assert len(files) > 6
    assert [r for f in files for r in private_reaches(f.read_text(), f.name)] == []


def test_the_checker_finds_a_reach_into_another_collaborators_private_name():
    source = (
        "from astraflow.dataflow.ledger import _StaleRule\n"
        "class Intake:\n"
        "    def accept(self, ledger):\n"
        "        self._seen = 1\n"            # its own: fine
        "        n = len(self._ledger._fresh)\n"  # another's private state
        "        return ledger._committing, type(self).__name__\n"
    )
    assert private_reaches(source, "intake.py") == [
        "intake.py:1: from astraflow.dataflow.ledger import _StaleRule",
        "intake.py:5: self._ledger._fresh",
        "intake.py:6: ledger._committing",
    ]


@pytest.mark.parametrize("room", [DATAFLOW, TRAINER, LAUNCH], ids=lambda p: p.name)
def test_no_function_in_the_room_is_over_60_lines(room):
    files = sorted(room.glob("*.py"))
    assert len(files) > 6
    assert [r for f in files for r in long_functions(f.read_text(), f.name)] == []
    long = "def f():\n" + "    x = 1\n" * 60
    assert long_functions(long, "f.py") == ["f.py:1: f has 61 lines"]


# ---- the contracts: the API a plugin implements, and nothing behind it ------------------

#: what a contract may import of the core: the data types, the errors, the deprecation
#: helper and the other contracts
CONTRACT_IMPORTS = ("astraflow.types", "astraflow.errors", "astraflow.deprecation",
                    "astraflow.contracts")


def test_the_contracts_import_no_implementation():
    graph = import_graph(modules())
    contracts = [m for m in graph if m.startswith("astraflow.contracts")]
    assert len(contracts) >= 7
    reached = {m: sorted(d for d in graph[m] if not d.startswith(CONTRACT_IMPORTS))
               for m in contracts}
    assert {m: d for m, d in reached.items() if d} == {}


#: the core's floors, by first part of a module's name: an import points down a floor
#: or stays on its own, so a room is read with the floor below it and nothing above.
#: The ground floor: the types, the settings' schema and the helpers every room shares.
GROUND = {"astraflow", "types", "errors", "schema", "security", "deprecation", "text",
          "hookspecs", "routing", "contracts", "plugins", "trajectory", "lifecycle",
          "launcher_options", "config", "components", "fielddocs", "conf"}
#: the rooms: the components (data layer, nodes, trainers, gateway, evaluator) and what
#: they are made of
ROOMS = {"dataflow", "raas", "trainer", "gateway", "workflows", "rl", "weights", "rewards",
         "tasks", "loggers", "models", "sandbox", "lora", "data_algorithms", "evaluate"}
#: the top: the launchers, the command line and what registers or tests everything
TOP = {"launch", "cli", "commands", "__main__", "builtins", "helptext", "newplugin",
       "testing", "api"}
#: imports allowed back up a floor, each with its reason (at most two)
ALLOWED_UP: dict[tuple[str, str], str] = {}


def floor_of(module: str) -> int | None:
    room = module.split(".")[1] if "." in module else module
    return 0 if room in GROUND else 1 if room in ROOMS else 2 if room in TOP else None


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Each import of a module on a higher floor than the importer's."""
    return sorted((mod, dep) for mod, deps in graph.items() for dep in deps
                  if (a := floor_of(mod)) is not None and (b := floor_of(dep)) is not None
                  and b > a and (mod, dep) not in ALLOWED_UP)


def test_every_core_module_has_a_floor():
    core = [m for m in modules() if m == "astraflow" or m.startswith("astraflow.")]
    assert [m for m in core if floor_of(m) is None] == []


def test_imports_point_down_the_floors():
    assert len(ALLOWED_UP) <= 2
    graph = import_graph({m: p for m, p in modules().items()
                          if m == "astraflow" or m.startswith("astraflow.")})
    assert upward(graph) == []


def test_the_floor_checker_finds_an_arrow_up():
    graph = {"astraflow.raas.node": {"astraflow.launch.local", "astraflow.types"},
             "astraflow.types": set(), "astraflow.launch.local": {"astraflow.raas.node"}}
    assert upward(graph) == [("astraflow.raas.node", "astraflow.launch.local")]
