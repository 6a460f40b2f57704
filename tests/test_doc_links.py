"""The relative links of the README and of every page under docs/ lead to files that exist, so
a page that is folded away or renamed cannot leave a dead link behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    """The page's markdown link targets that name a file of the repository."""
    targets = (m.group(1) for m in LINK.finditer(page.read_text()))
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:|#", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file(page: Path) -> None:
    dead = [t for t in relative_links(page) if not (page.parent / t).exists()]
    assert not dead, f"{page.relative_to(REPO)}: dead links {dead}"


def test_the_links_are_found() -> None:
    readme = relative_links(REPO / "README.md")
    assert "docs/results/corpus.md" in readme
    assert "gavel-crosscheck.md" in relative_links(REPO / "docs" / "results" / "README.md")
