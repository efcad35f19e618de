"""The live package as a plugin of the agent registry (appliance/agents/registry.py):
``live`` and ``live:SPEC`` run a GPT-Live WebRTC session (call.py) with the agent SPEC names
in ``--live-agent``'s language (``assistant[?options]``, ``realtime``,
``realtime:<module:attr|file.py:attr>``; ``live`` alone: the default, ``assistant``).
Signaling's ``POST /v1/live/sessions`` places its calls with this spec, and a SIP call's
Live accept answers with it (appliance/signaling/live_http.py).

agents/ names none of this: importing this module registers the family, and the processes
that run agents import it through appliance/plugins.py. The shell and the agent load with
the first spec, so a transceiver that never runs a Live call never imports them.
"""

from __future__ import annotations

from ..agents.context import AgentContext
from ..agents.loader import AgentError
from ..agents.registry import AgentFn, register_family

FAMILY = "live"
DEFAULT = "assistant"  # agent.py DEFAULT_LIVE_AGENT, without importing it (and its chain)

__all__ = ["FAMILY", "agent_spec", "resolve"]


def agent_spec(live_agent: str) -> str:
    """The call's agent spec for a ``--live-agent`` SPEC."""
    return f"{FAMILY}:{live_agent}"


def resolve(spec: str) -> AgentFn:
    """``live`` or ``live:SPEC`` -> the agent function running the Live call shell."""
    if spec == FAMILY:
        inner = DEFAULT
    elif spec.startswith(FAMILY + ":") and spec[len(FAMILY) + 1 :]:
        inner = spec[len(FAMILY) + 1 :]
    else:
        raise AgentError(f"agent {spec!r}: expected live or live:<--live-agent spec>")
    from .agent import live_factory
    from .call import LiveCallShell

    factory = live_factory(inner)

    async def run(ctx: AgentContext) -> None:
        await LiveCallShell(ctx, factory()).run()

    return run


register_family(FAMILY, resolve)
