"""The Realtime protocol core is sans-IO like appliance/proto (STYLE.md rule 1): only the
shell, appliance/realtime/agent.py, may import trio; the machine takes no clock at all
(what was heard comes from the injected queue measure)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from proto.test_sans_io import FORBIDDEN, _imports

REALTIME = Path(__file__).resolve().parents[2] / "appliance" / "realtime"
# The trio shells: AgentContext, a WebSocket, the speech engines they both run for
# transcription events and for the turn engine's pause work, and the sideband's long-poll
# fan-out.
SHELLS = {"agent.py", "ws_session.py", "transcription.py", "turns.py", "sideband.py"}
# rthttp's routes (http.py) and rtbridge's upstream bridge (bridge.py) are shells too.
CORE = [p for p in sorted(REALTIME.glob("*.py"))
        if p.name not in SHELLS | {"http.py", "bridge.py"}]


def test_core_modules_exist() -> None:
    assert {"protocol.py", "session.py", "conversation.py", "machine.py"} <= {
        p.name for p in CORE}


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_no_io_imports(path: Path) -> None:
    bad = {n for n in _imports(path) for f in FORBIDDEN if n == f or n.startswith(f + ".")}
    assert not bad, f"{path} imports {sorted(bad)}; the realtime core must stay sans-IO"
    # Constants and error types from appliance.agents are fine (bridge_state.py takes the
    # sample rate and AgentError); the session object itself is the shells' business.
    names = {a.name for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.ImportFrom) for a in node.names}
    assert not names & {"AgentContext", "AgentHost"}, f"{path}: the core does not know AgentContext"
