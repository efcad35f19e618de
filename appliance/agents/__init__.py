"""Agents: the interface voice-agent code programs against, and the built-in agents.

See :mod:`appliance.agents.context` for the timing model. The short version::

    from appliance.agents import AgentContext

    async def my_agent(ctx: AgentContext) -> None:
        async for frame in ctx.frames():      # 20 ms mono PCM16 @ 48 kHz, .speech flag
            if frame.speech:
                ctx.interrupt()               # barge-in: drop what we were saying
            await ctx.send(frame.pcm)         # any length; paced at real time

Run it with ``appliance transceiver --agent mypkg.mymod:my_agent`` (or ``path/file.py:attr``).
Agents in other languages serve a WebSocket instead: ``--agent ws://host:port/path`` runs
the bridge in :mod:`appliance.agents.ws`; the protocol is docs/agent-protocol.md.
"""

from __future__ import annotations

from .channels import (
    ChannelClosed,
    ChannelError,
    ChannelEvent,
    ChannelInfo,
    ChannelMessage,
    ChannelOpened,
)
from .context import (
    FRAME_BYTES,
    FRAME_SAMPLES,
    SAMPLE_RATE,
    AgentContext,
    AgentHost,
    AgentIdentity,
    Frame,
    SessionEnded,
)
from .registry import (
    DEFAULT_AGENT,
    PASSTHROUGH,
    AgentError,
    AgentFn,
    ResolvedAgent,
    agent_kind,
    provide_transcripts,
    register,
    register_family,
    register_scheme,
    resolve,
)
from .vad import EnergyVad, level_dbfs

__all__ = [
    "ChannelClosed", "ChannelError", "ChannelEvent", "ChannelInfo", "ChannelMessage",
    "ChannelOpened",
    "DEFAULT_AGENT", "FRAME_BYTES", "PASSTHROUGH", "FRAME_SAMPLES", "SAMPLE_RATE", "AgentContext",
    "AgentError", "AgentFn", "AgentHost", "AgentIdentity", "EnergyVad", "Frame",
    "ResolvedAgent", "SessionEnded", "agent_kind", "level_dbfs", "provide_transcripts",
    "register", "register_family", "register_scheme", "resolve",
]
