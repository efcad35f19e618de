"""An agent that listens and reports one turn's waterfall — ``turn.metrics``, the event the
built-in assistant sends (speech/assistant.py ``TurnMarks``) — after the caller's first 10
frames, plus one ``turn.metrics`` without a turn number, which the transceiver must drop:
what a call to the assistant leaves in the session object, without the speech models. It
sends no audio, so a page that called its first audio "setup" would wait forever. Loaded by
the tests as ``path/turn_agent.py:agent``."""

from __future__ import annotations

from appliance.agents import AgentContext

#: The caller spoke 1.3 s and paused; the end of turn was decided 520 ms later; the reply's
#: first frame went out 31.2 ms after that: 551.2 ms from the caller's end of speech.
TURN = {"turn": 1, "speech_start_ms": -1840.0, "speech_end_ms": -520.0, "transcript_ms": 2.1,
        "stt_ms": 2.0, "first_token_ms": -60.3, "first_audio_ms": 31.0, "first_sent_ms": 31.2}


async def agent(ctx: AgentContext) -> None:
    frames = 0
    async for _ in ctx.frames():
        frames += 1
        if frames == 10:
            await ctx.send_event({"type": "turn.metrics", **TURN, "first_queued_ms": 31.1,
                                  "note": "not a mark: left out"})
            await ctx.send_event({"type": "turn.metrics", "speech_end_ms": -1.0})
