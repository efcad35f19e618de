"""An echo agent that also reports transcript lines (``transcript.agent`` at the start,
``transcript.user.final`` after the caller's first second of audio) and that turn's
waterfall (``turn.metrics``), the events the built-in assistant sends
(speech/assistant.py): what a phone call's end-of-call report must carry. Loaded by the
phone tests as ``path/transcript_agent.py:agent``."""

from __future__ import annotations

from appliance.agents import AgentContext

GREETING = "hello, you are through to the echo"
HEARD = "a one kilohertz tone"
TURN = {"turn": 1, "speech_start_ms": -1000.0, "speech_end_ms": -500.0, "transcript_ms": 20.0,
        "stt_ms": 20.0, "first_token_ms": 21.0, "first_audio_ms": 80.0, "first_sent_ms": 81.0}


async def agent(ctx: AgentContext) -> None:
    await ctx.send_event({"type": "transcript.agent", "text": GREETING})
    frames = 0
    async for frame in ctx.frames():
        await ctx.send(frame.pcm)
        frames += 1
        if frames == 50:  # a second of the caller: "heard" something
            await ctx.send_event({"type": "transcript.user.final", "text": HEARD})
            await ctx.send_event({"type": "turn.metrics", **TURN})
