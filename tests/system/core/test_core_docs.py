"""The documentation site builds with `mkdocs build --strict` -- every page, every link,
every reference rendered from the source -- and a broken link makes that build fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PAGES = ["index", "architecture", "facts", "configuration", "backends", "own-model",
         "own-agent", "multi-policy", "running", "plugins", "benchmarks", "plugin-api",
         "changelog", "reference", "reference/hookspecs", "reference/contracts",
         "reference/types", "reference/config", "reference/errors", "reference/workflows",
         "reference/rewards", "reference/loggers", "reference/rl", "reference/testing",
         "reference/deprecation"]


def build(project: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=project, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))


def test_the_site_builds_strict_with_every_page_and_the_api_reference(tmp_path):
    site = tmp_path / "site"
    done = build(ROOT, site)
    assert done.returncode == 0, (
        f"mkdocs build --strict failed (pip install -e '.[docs]' if mkdocs is missing):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    missing = [p for p in PAGES if not (site / p / "index.html").exists()
               and not (p == "index" and (site / "index.html").exists())]
    assert missing == []
    # the reference is rendered from docstrings, with their Sphinx roles as links
    contracts = (site / "reference" / "contracts" / "index.html").read_text()
    assert 'id="astraflow.contracts.rollout.RolloutBackend"' in contracts
    assert "Token in, token out" in contracts  # RolloutBackend's docstring
    hookspecs = (site / "reference" / "hookspecs" / "index.html").read_text()
    assert "astraflow_register_rollout_backends" in hookspecs
    assert ":class:`" not in hookspecs
    assert 'href="../contracts/#astraflow.contracts.rollout.RolloutBackend"' in hookspecs
    assert (site / "dashboard.png").exists()
    assert not (site / "tools").exists()  # the docs' own scripts are not published


def test_a_broken_link_fails_the_strict_build(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", project / "docs")
    (project / "core").symlink_to(ROOT / "core")
    with (project / "docs" / "configuration.md").open("a") as page:
        page.write("\nSee [the missing page](no-such-page.md).\n")
    done = build(project, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr
