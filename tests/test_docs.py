"""The documentation holds together: every relative link leads somewhere, each command's page
lists the options its ``--help`` prints, and the architecture's map names every part of the package."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "bench" / "HISTORY.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*$", re.MULTILINE)


def _anchors(page: Path) -> set[str]:
    """The anchors a Markdown renderer such as GitHub's gives the page's headings."""
    text = FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-") for title in HEADING.findall(text)}


def _broken_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):  # https:, mailto: ...: not this repository's
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{page.relative_to(ROOT)}: {target} (no heading with that anchor)")
    return broken


def test_every_relative_link_in_the_documentation_leads_to_a_file_and_heading_that_exist():
    broken = [problem for page in PAGES for problem in _broken_links(page)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_each_command_page_lists_the_options_its_help_prints():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cli_docs.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"docs/cli is out of date:\n{result.stderr}"


def test_the_architecture_map_names_every_package_and_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    the_map = text[text.index("## The map") : text.index("### Where to change what")]
    named = {
        name for row in re.findall(r"^\| ([^|]*) \|", the_map, re.MULTILINE) for name in re.findall(r"`([^`]+)`", row)
    }
    package = ROOT / "files" / "python" / "hsextract"
    parts = [
        f"{p.name}/" if p.is_dir() else p.name
        for p in package.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    ]
    missing = sorted(p for p in parts if not p.startswith("__") and p not in named)
    assert not missing, f"docs/architecture.md's map does not name: {', '.join(missing)}"
