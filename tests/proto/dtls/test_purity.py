"""STYLE.md rule 1: the DTLS and SRTP cores do no I/O and read no clock."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3] / "appliance" / "proto"
FORBIDDEN = {"trio", "asyncio", "socket", "time", "logging", "OpenSSL", "select", "threading"}


@pytest.mark.parametrize(
    "path",
    sorted([*ROOT.joinpath("dtls").glob("*.py"), *ROOT.joinpath("srtp").glob("*.py")]),
    ids=lambda p: p.name,
)
def test_no_io_imports(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        for name in names:
            assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
