"""The built-in ``echo`` agent: plays the caller's voice straight back.

Each frame is queued the moment it arrives, so the only buffering is the frame itself.
"""

from __future__ import annotations

from .context import AgentContext


async def echo(ctx: AgentContext) -> None:
    async for frame in ctx.frames():
        await ctx.send(frame.pcm)
