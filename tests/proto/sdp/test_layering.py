"""STYLE.md rules 1 and 8: the SDP and RTP cores do no I/O, and SDP knows nothing of
DTLS or SRTP (aiortc's sdp.py importing its DTLS transport is the tangle to avoid)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import appliance.proto.rtp
import appliance.proto.sdp

FORBIDDEN = {"trio", "asyncio", "socket", "time", "logging", "os", "selectors"}


def _imports(pkg: Path) -> set[str]:
    names: set[str] = set()
    for path in pkg.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
    return names


@pytest.mark.parametrize("module", [appliance.proto.sdp, appliance.proto.rtp])
def test_no_io_imports(module: object) -> None:
    pkg = Path(module.__file__).parent  # type: ignore[attr-defined]
    for name in _imports(pkg):
        assert name.split(".")[0] not in FORBIDDEN, name


def test_sdp_does_not_import_dtls_or_srtp() -> None:
    pkg = Path(appliance.proto.sdp.__file__).parent
    for name in _imports(pkg):
        assert not any(p in name for p in ("dtls", "srtp", "pylibsrtp", "cryptography")), name
