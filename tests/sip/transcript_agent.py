"""An echo agent that also reports transcript lines (``transcript.agent`` at the start,
``transcript.user.final`` after the caller's first second of audio), the events the
built-in assistant sends (speech/assistant.py): what a phone call's end-of-call report
must carry. Loaded by the phone tests as ``path/transcript_agent.py:agent``."""

from __future__ import annotations

from appliance.agents import AgentContext

GREETING = "hello, you are through to the echo"
HEARD = "a one kilohertz tone"


async def agent(ctx: AgentContext) -> None:
    await ctx.send_event({"type": "transcript.agent", "text": GREETING})
    frames = 0
    async for frame in ctx.frames():
        await ctx.send(frame.pcm)
        frames += 1
        if frames == 50:  # a second of the caller: "heard" something
            await ctx.send_event({"type": "transcript.user.final", "text": HEARD})
