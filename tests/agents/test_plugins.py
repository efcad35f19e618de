"""Plugins point down (issue 39, item 5): agents/ names no plugin; realtime/ and speech/
register themselves (appliance/realtime/plugin.py, appliance/speech/plugin.py) and the
roles that run agents import them through appliance/plugins.py; ``ctx.transcripts()`` runs
the provider it is given, never an import of its own."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest

from appliance.agents import (
    AgentContext,
    AgentError,
    AgentHost,
    AgentIdentity,
    register_family,
    resolve,
)
from appliance.agents.registry import family_name

APPLIANCE = Path(__file__).resolve().parents[2] / "appliance"
PLUGINS = ("appliance.realtime", "appliance.speech", "appliance.live")


def _named_modules(path: Path) -> set[str]:
    """Every module a file of agents/ imports, or names in a code string (an
    ``import_module("…")``, a table of ``module:attr``); docstrings explain, they are not
    read as names."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = "appliance.agents".split(".")[: 2 - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
                out.update(f"{module}.{a.name}" for a in node.names)
            else:
                out.add(node.module or "")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            out.update(w for w in node.value.replace(":", " ").split() if w.startswith(PLUGINS))
    return out


def test_agents_names_no_plugin(tmp_path: Path) -> None:
    for path in sorted((APPLIANCE / "agents").glob("*.py")):
        bad = sorted(n for n in _named_modules(path) if n.startswith(PLUGINS))
        assert not bad, f"{path.name} names a plugin: {bad}"
    # the check itself, on what the registry and context did before issue 39
    fake = tmp_path / "registry.py"
    fake.write_text('"""Docstrings may name appliance.speech.assistant."""\n'
                    "import importlib\n\n"
                    "def f():\n    return importlib.import_module('appliance.speech.listen')\n"
                    "from ..realtime import agent\n")
    assert _named_modules(fake) == {"importlib", "appliance.speech.listen",
                                    "appliance.realtime.agent"}


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.strip()


def test_nothing_is_registered_until_the_plugins_are_imported() -> None:
    """A fresh process with agents/ alone knows echo, passthrough, ws:// and nothing of
    realtime or speech; importing appliance.plugins registers both."""
    out = _run(
        "from appliance.agents import AgentError, resolve\n"
        "for spec in ('realtime', 'assistant', 'realtime+ws://h/x'):\n"
        "    try:\n"
        "        resolve(spec)\n"
        "        print(spec, 'resolved')\n"
        "    except AgentError as exc:\n"
        "        print(spec, str(exc).split(' (')[0])\n"
        "import sys\n"
        "print(sorted(m for m in sys.modules if m.startswith(('appliance.realtime', "
        "'appliance.speech', 'appliance.live'))))\n"
        "import appliance.plugins\n"
        "print(resolve('realtime').name)\n")
    assert out.splitlines() == [
        "realtime unknown agent 'realtime'",
        "assistant unknown agent 'assistant'",
        "realtime+ws://h/x agent 'realtime+ws://h/x': no bridge for realtime+ws:// agents is "
        "installed",
        "[]",
        "realtime",
    ]


@pytest.mark.parametrize("module", ["appliance.transceiver.cli", "appliance.signaling.cli",
                                    "appliance.supervisor"])
def test_each_role_that_resolves_agents_loads_the_plugins(module: str) -> None:
    out = _run(f"import {module}\n"
               "from appliance.agents import registry\n"
               "from appliance.realtime import registry as rt\n"
               "from appliance.agents import context\n"
               "print(sorted(registry._families), sorted(registry._schemes), rt.registered(),"
               " context._transcripts is not None)")
    assert out == ("['assistant', 'live', 'realtime'] ['realtime+ws', 'realtime+wss', 'ws', 'wss'] "
                   "['assistant'] True")


def test_family_names_and_registration() -> None:
    assert family_name("assistant?llm=http://h/v1") == "assistant"
    assert family_name("realtime:pkg.mod:Agent") == "realtime"
    assert family_name("pkg.mod:attr") == "pkg.mod"
    assert family_name("echo") == "echo"
    seen: list[str] = []

    async def agent(ctx: AgentContext) -> None:
        pass

    def resolver(spec: str) -> Any:
        seen.append(spec)
        if spec.endswith("bad"):
            raise AgentError("bad option")
        return agent

    register_family("test-family", resolver)
    assert resolve("test-family?url=http://x/y").run is agent  # before the scheme split
    assert resolve("test-family").run is agent
    with pytest.raises(AgentError, match="bad option"):
        resolve("test-family:bad")
    assert seen == ["test-family?url=http://x/y", "test-family", "test-family:bad"]


async def test_transcripts_runs_the_injected_provider() -> None:
    got: list[tuple[Any, dict[str, Any]]] = []

    async def provider(ctx: AgentContext, **options: Any) -> AsyncGenerator[str, None]:
        got.append((ctx, options))
        yield "a turn"

    host = AgentHost()
    ctx = AgentContext(host, AgentIdentity("t", "s1"), transcripts=provider)
    assert [e async for e in ctx.transcripts(stt="x")] == ["a turn"]
    assert got == [(ctx, {"stt": "x"})]


def test_transcripts_without_a_provider_says_what_to_load() -> None:
    out = _run("from appliance.agents import AgentContext, AgentHost, AgentIdentity\n"
               "ctx = AgentContext(AgentHost(), AgentIdentity('t', 's'))\n"
               "try:\n"
               "    ctx.transcripts()\n"
               "except RuntimeError as exc:\n"
               "    print(exc)\n")
    assert "speech package" in out and "appliance.plugins" in out


def test_the_speech_plugin_provides_listen_transcripts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite loads the plugins (conftest.py), as a transceiver does: a context made with
    no provider runs appliance.speech.listen.transcripts."""
    from appliance.agents import context
    from appliance.speech import listen, plugin

    assert context._transcripts is plugin.transcripts
    calls: list[tuple[Any, dict[str, Any]]] = []

    def fake(ctx: AgentContext, **options: Any) -> Any:
        calls.append((ctx, options))
        return "the generator"

    monkeypatch.setattr(listen, "transcripts", fake)
    ctx = AgentContext(AgentHost(), AgentIdentity("t", "s1"))
    assert ctx.transcripts(stt="x") == "the generator"
    assert calls == [(ctx, {"stt": "x"})]
