"""The GPT-Live core is sans-IO (STYLE.md rule 1): the parser, the config, the events and
the state machine import no I/O or clock library, not even through what they import (the
Realtime machine under it included); only the shell (socket.py) and the agent wrapper
(agent.py, which reaches the agents' loader) may, and store.py (the stored sessions' files,
with the recording's writer) and backend.py (Responses delegation's HTTP; responses.py,
its translation, is core)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from proto.test_sans_io import FORBIDDEN, _imports

LIVE = Path(__file__).resolve().parents[2] / "appliance" / "live"
# store: file I/O; backend: Responses delegation's HTTP (responses.py is its core)
SHELLS = {"socket.py", "agent.py", "call.py", "plugin.py", "store.py", "backend.py"}
CORE = [p for p in sorted(LIVE.glob("*.py")) if p.name not in SHELLS]


def test_the_core_modules_are_there() -> None:
    assert {"schema.py", "protocol.py", "config.py", "events.py", "connection.py",
            "responses.py"} <= {
        p.name for p in CORE}


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_no_io_imports(path: Path) -> None:
    bad = {n for n in _imports(path) for f in FORBIDDEN if n == f or n.startswith(f + ".")}
    assert not bad, f"{path} imports {sorted(bad)}; the live core must stay sans-IO"


def test_nothing_it_imports_brings_trio() -> None:
    modules = ", ".join(f"appliance.live.{p.stem}" for p in CORE if p.stem != "__init__")
    code = (f"import sys, {modules}\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            f"{sorted(FORBIDDEN - {'time', 'threading', 'socket', 'select', 'selectors'})!r})\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == ""
