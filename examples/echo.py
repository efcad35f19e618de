"""Echo: plays the caller's voice straight back (the smallest useful agent).

    appliance transceiver --secret-file secret --agent examples/echo.py:echo
"""

from __future__ import annotations

from appliance.agents import AgentContext


async def echo(ctx: AgentContext) -> None:
    async for frame in ctx.frames():  # 20 ms of mono PCM16 at 48 kHz, in order
        await ctx.send(frame.pcm)  # queued; the transceiver paces it at real time
