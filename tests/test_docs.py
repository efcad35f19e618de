"""The README and docs/ as a fresh clone has them (issue 22): they never send a reader
outside the repository (``../shared/`` is not in a clone), and every relative link and
``docs/…`` path they name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", REPO / "examples" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _ids(p: Path) -> str:
    return str(p.relative_to(REPO))


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_no_page_points_outside_the_repo(page: Path) -> None:
    assert "../shared" not in page.read_text(), f"{page.name} points at ../shared/"


@pytest.mark.parametrize("page", PAGES, ids=_ids)
def test_relative_links_resolve(page: Path) -> None:
    text = page.read_text()
    missing = []
    for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s):, mailto:
        if not (page.parent / target).exists():
            missing.append(target)
    assert missing == [], f"{page.name}: broken links {missing}"
