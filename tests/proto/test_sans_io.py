"""appliance/proto is sans-IO: no module there may import an I/O or clock library."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PROTO = Path(__file__).resolve().parents[2] / "appliance" / "proto"
FORBIDDEN = {"trio", "asyncio", "socket", "time", "selectors", "select", "threading",
             "subprocess", "logging.config", "anyio"}
FILES = sorted(PROTO.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_proto_has_modules() -> None:
    assert len(FILES) >= 4


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PROTO)))
def test_no_io_imports(path: Path) -> None:
    bad = {n for n in _imports(path) for f in FORBIDDEN if n == f or n.startswith(f + ".")}
    assert not bad, f"{path} imports {sorted(bad)}; protocol cores must stay sans-IO"


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    p = tmp_path / "bad.py"
    p.write_text("import trio\nfrom time import monotonic\n")
    assert _imports(p) == {"trio", "time"}


def test_sctp_core_is_covered() -> None:
    """The SCTP/DCEP core (issue 16) is checked like every other protocol package."""
    names = {str(p.relative_to(PROTO)) for p in FILES}
    assert {"sctp/association.py", "sctp/datachannel.py", "sctp/chunks.py"} <= names
