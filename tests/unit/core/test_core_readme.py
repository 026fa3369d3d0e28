"""The README stays the front door: short, its links into docs/ lead to pages that exist,
and its layout names every directory and top-level module of the core and every plugin,
and nothing that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
MAX_LINES = 400
LINK = re.compile(r"\]\(([^)\s]+)\)")


def layout_block(text: str) -> str:
    section = text.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def test_the_readme_is_at_most_400_lines():
    assert len(README.read_text().splitlines()) <= MAX_LINES


def test_every_link_from_the_readme_into_docs_leads_to_a_file():
    targets = [t.split("#", 1)[0] for t in LINK.findall(README.read_text())]
    into_docs = [t for t in targets if t.startswith("docs/")]
    assert "docs/index.md" in into_docs and "docs/dashboard.png" in into_docs
    assert [t for t in into_docs if not (ROOT / t).is_file()] == []
    # and the README's other relative links too (examples/...)
    local = [t for t in targets if "://" not in t and not t.startswith("docs/")]
    assert [t for t in local if not (ROOT / t).exists()] == []


def test_the_layout_names_every_directory_and_module_of_the_core_and_every_plugin():
    block = layout_block(README.read_text())
    words = set(re.findall(r"[A-Za-z_][\w.]*", block))
    core = ROOT / "core" / "astraflow"
    entries = {p.stem for p in core.iterdir()
               if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    entries -= {"__init__", "__main__"}
    plugins = {p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists()}
    assert sorted((entries | plugins) - words) == []


def test_every_directory_the_layout_names_exists():
    block = layout_block(README.read_text())
    bases = [ROOT, ROOT / "core", ROOT / "core" / "astraflow", ROOT / "tests", ROOT / "plugins",
             ROOT / "examples"]
    named = set(re.findall(r"([A-Za-z_][\w.]*)/", block)) - {"name"}
    assert {"core", "dataflow", "plugins", "tests", "bench", "docs"} <= named
    assert sorted(n for n in named if not any((b / n).is_dir() for b in bases)) == []
