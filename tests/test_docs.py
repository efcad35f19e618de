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


def _layout_mentions() -> tuple[set[str], set[str]]:
    """docs/architecture.md's "Code layout" block read as a tree: a ``name/`` at the start
    of a line opens a directory under the nearest less-indented one; every ``x.py`` on a
    line (entry or continuation) is a module of the directory open there. Returns the
    directories and the modules (``appliance/proto/stun/message.py``) it names."""
    text = (REPO / "docs" / "architecture.md").read_text()
    block = text.split("## Code layout", 1)[1].split("```", 2)[1]
    dirs: set[str] = set()
    mods: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        entry = re.match(r"(\w+)(/|\.py)?(\s|$)", line.lstrip())
        if entry and indent <= (stack[-1][0] + 2 if stack else 0):
            while stack and stack[-1][0] >= indent:
                stack.pop()
            if entry.group(2) == "/":
                path = f"{stack[-1][1]}/{entry.group(1)}" if stack else entry.group(1)
                stack.append((indent, path))
                dirs.add(path)
        where = stack[-1][1] if stack else ""
        mods.update(f"{where}/{m}" for m in re.findall(r"(?<![/\w])(\w+\.py)\b", line))
    return dirs, mods


def test_every_module_is_named_in_the_architecture_layout() -> None:
    """Issue 39 item 6: the house tour names every room. Each package under appliance/ has
    its line in docs/architecture.md's layout and each module is named in its package's
    lines (``__init__``/``__main__`` aside), so a new module comes with its sentence."""
    dirs, mods = _layout_mentions()
    want_dirs = {str(p.relative_to(REPO)) for p in (REPO / "appliance").rglob("*")
                 if p.is_dir() and p.name != "__pycache__"} | {"appliance"}
    want_mods = {str(p.relative_to(REPO)) for p in (REPO / "appliance").rglob("*.py")
                 if p.name not in ("__init__.py", "__main__.py")}
    assert sorted(want_dirs - dirs) == [], "packages missing from docs/architecture.md's layout"
    assert sorted(want_mods - mods) == [], "modules missing from docs/architecture.md's layout"
    assert sorted(mods - want_mods) == [], "the layout names modules that do not exist"
