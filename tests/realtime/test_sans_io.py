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


def test_the_machine_brings_no_trio_with_the_turn_engine() -> None:
    """The machine takes its turns from appliance.speech.vad: importing it must not pull
    the speech package's trio shells in (the package loads its names lazily)."""
    import subprocess
    import sys

    code = ("import sys, appliance.realtime.machine\n"
            "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('trio', 'subprocess', 'asyncio', 'socket'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == ""


def test_the_speech_package_exports_what_it_lists() -> None:
    import appliance.speech as speech

    assert sorted(speech.__all__) == sorted(speech._WHERE)
    for name in speech.__all__:
        assert getattr(speech, name) is not None
